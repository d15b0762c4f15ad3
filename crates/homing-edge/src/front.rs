//! The router's side toward clients. [`EdgeRouter::spawn`] puts the router
//! on a listener: HTTP/2 goes through hyper to [`EdgeRouter::handle`],
//! HTTP/1.1 to the router's own server side, the rest of this module.
//!
//! The router's own HTTP/1.1 server side: a client connection's requests
//! read, routed, forwarded and answered in the connection's task, without
//! hyper's dispatcher, header maps or request objects. The request head is
//! parsed (httparse, [`crate::h1`]) out of the connection's read buffer and
//! forwarded from its slices; the body, if any, is framed by length or
//! chunks and buffered under the router's bounds; the response head is
//! written into the connection's write buffer together with as much of the
//! body as the actor already sent, in one write.
//!
//! ```text
//!  read head ──complete──► route ──► body (bounded) ──► resolve, forward (one retry) ──► write answer ──keep-alive──► read head
//!     ├── too large: 431, bad: 400, target too long: 414 ─► close        │                   └── Connection: close, HTTP/1.0 without keep-alive,
//!     └── closed by the client ─► end                                      │                       a CONNECT, a body cut, or shutting down ─► close
//!                                         refused (the body unread: then close) ─► write refusal
//! ```
//!
//! Requests are answered one at a time, in order: bytes of the next
//! (pipelined) request wait in the read buffer, which holds at most one
//! request head ([`h1::REQUEST_HEAD_BYTES_MAX`]) plus one read. Time bounds
//! are the connection's ([`crate::connection`]): the header read and idle
//! timeouts watch it from outside, a write that makes no progress fails
//! after the write timeout; the body has `body_read_timeout_ms`.
//! `expect: 100-continue` is answered `100 Continue` before the body is
//! read; an `upgrade` header is dropped like every hop-by-hop header (the
//! request goes on as a plain one); a CONNECT is forwarded like any request
//! and its connection closed after the answer.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use hyper::body::Body;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{SemaphorePermit, watch};

use crate::connection::{Http1Connection, Http1Server};
use crate::h1::{
    self, Decoded, Decoder, Framing, HeadError, Headers, RequestHead, ResponseHead, Sending,
};
use crate::listener::{self, Serving};
use crate::pool::PooledBody;
use crate::route::{origin_form, route};
use crate::router::{EdgeRouter, Refusal};

/// Most bytes read from a client at once (hyper's first read buffer size).
const READ_BYTES: usize = 8 * 1024;
/// A read or write buffer grown past this (a large head, a large answer)
/// is not kept for the connection's next request, in bytes.
const BUFFER_KEEP_BYTES: usize = 64 * 1024;
/// Response bytes gathered before they are written, at most (plus one piece).
const WRITE_BYTES: usize = 64 * 1024;

impl EdgeRouter {
    /// Serves on `listener` in a background task until [`Serving::stop`].
    /// Fails only if the listener has no local address.
    pub fn spawn(&self, listener: TcpListener) -> std::io::Result<Serving> {
        let router = self.clone();
        let service = service_fn(move |request| {
            let router = router.clone();
            async move { Ok::<_, Infallible>(router.handle(request).await) }
        });
        let (stop, _) = watch::channel(None);
        let http1 = Some(server(self.clone()));
        listener::spawn(
            listener,
            service,
            http1,
            self.config().serve,
            Arc::new(stop),
        )
    }

    /// Serves on `listener` until `shutdown` resolves, then gives in-flight
    /// requests up to `drain` and returns. Fails only if the listener has
    /// no local address.
    pub async fn run(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
        drain: Duration,
    ) -> std::io::Result<()> {
        let serving = self.spawn(listener)?;
        shutdown.await;
        serving.stop(drain).await;
        Ok(())
    }
}

/// The router's HTTP/1.1 server side, for [`listener::spawn`].
fn server(router: EdgeRouter) -> Http1Server {
    Arc::new(move |connection| {
        let served: Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>> =
            Box::pin(answer_requests(router.clone(), connection));
        served
    })
}

/// How reading a request head ended.
enum Head {
    /// A complete head of this many bytes is at the start of the buffer.
    Complete(usize),
    /// The client closed the connection (between requests, or mid-head).
    Closed,
    /// The head is refused: answered, then the connection closes.
    Refused(HeadError),
}

/// Answers one client connection's HTTP/1.1 requests, in order, until it
/// closes, asks to, or is shutting down.
async fn answer_requests(
    router: EdgeRouter,
    mut connection: Http1Connection,
) -> std::io::Result<()> {
    let mut read = BytesMut::with_capacity(READ_BYTES);
    let mut write = Vec::new();
    loop {
        let len = match read_head(&mut connection, &mut read).await? {
            Head::Complete(len) => len,
            Head::Closed => return Ok(()),
            Head::Refused(error) => return refuse_head(&mut connection, &mut write, &error).await,
        };
        let _in_flight = connection.request_started();
        let head = read.split_to(len).freeze();
        let mut slots = h1::request_slots();
        let request = match h1::parse_request(&head, &mut slots) {
            Ok(request) => request,
            Err(error) => return refuse_head(&mut connection, &mut write, &error).await,
        };
        let keep = exchange(&router, &mut connection, &mut read, &mut write, &request).await?;
        if !keep {
            return close(&mut connection).await;
        }
        // Buffers grown by a large head or answer are not kept.
        if write.capacity() > BUFFER_KEEP_BYTES {
            write = Vec::new();
        }
        if read.is_empty() && read.capacity() > BUFFER_KEEP_BYTES {
            read = BytesMut::new();
        }
    }
}

/// Answers a refused request head with its status (no body), then ends
/// the connection.
async fn refuse_head(
    connection: &mut Http1Connection,
    write: &mut Vec<u8>,
    error: &HeadError,
) -> std::io::Result<()> {
    tracing::debug!(%error, "request head refused");
    write_plain(connection, write, error.status(), &[], false, true, false).await?;
    close(connection).await
}

/// Ends the connection: what was written is flushed and a FIN sent.
async fn close(connection: &mut Http1Connection) -> std::io::Result<()> {
    let _ = connection.io.shutdown().await;
    Ok(())
}

/// Reads until `read` starts with a complete request head (bounded).
async fn read_head(connection: &mut Http1Connection, read: &mut BytesMut) -> std::io::Result<Head> {
    loop {
        if !read.is_empty() {
            match h1::request_head_len(&read[..]) {
                Ok(Some(len)) => return Ok(Head::Complete(len)),
                Ok(None) => {}
                Err(error) => return Ok(Head::Refused(error)),
            }
        }
        if read_more(connection, read).await? == 0 {
            return Ok(Head::Closed);
        }
    }
}

/// One read of at most [`READ_BYTES`] into `read`; 0 at the client's close.
async fn read_more(
    connection: &mut Http1Connection,
    read: &mut BytesMut,
) -> std::io::Result<usize> {
    read.reserve(READ_BYTES);
    connection
        .io
        .read_buf(&mut (&mut *read).limit(READ_BYTES))
        .await
}

/// Answers one request; whether the connection can carry another.
async fn exchange(
    router: &EdgeRouter,
    connection: &mut Http1Connection,
    read: &mut BytesMut,
    write: &mut Vec<u8>,
    request: &RequestHead<'_>,
) -> std::io::Result<bool> {
    router.count_request();
    let http11 = request.http11;
    // A refusal before the body is read ends the connection: the unread
    // body is not taken for the next request.
    let keep_unread = request.keep_alive && request.body == Framing::Empty;
    let Some(target) = origin_form(request.target) else {
        write_plain(
            connection,
            write,
            StatusCode::BAD_REQUEST,
            &[],
            false,
            http11,
            request.method == Method::HEAD,
        )
        .await?;
        return Ok(false);
    };
    let headers = Headers::Raw(request.headers);
    let config = router.config();
    let routed = match route(headers.get(config.key_header.as_str()), target, config) {
        Ok(routed) => routed,
        Err(e) => {
            let refusal = router.unroutable(&e);
            write_refusal(connection, write, refusal, keep_unread, request).await?;
            return Ok(keep_unread);
        }
    };
    // `100 Continue` only to HTTP/1.1 clients (RFC 9110 §10.1.1), and only
    // once the declared length is within the bound (`read_body`).
    let go_on = request.expect_continue && http11;
    // The body's bytes stay counted until the answer is on its way.
    let (body, buffered) = match read_body(router, connection, read, request.body, go_on).await? {
        Ok(read) => read,
        Err(status) => {
            let refusal = router.refuse_body(status, routed.key);
            write_refusal(connection, write, refusal, false, request).await?;
            return Ok(false);
        }
    };
    let answer = router
        .deliver(
            routed.key,
            &request.method,
            &routed.path_and_query,
            headers,
            &body,
        )
        .await;
    drop(buffered);
    // A CONNECT answered 2xx would make the connection a tunnel: not offered.
    let keep = request.keep_alive && request.method != Method::CONNECT;
    match answer {
        Ok(response) => write_response(connection, write, response, request, keep).await,
        Err(refusal) => {
            write_refusal(connection, write, refusal, keep, request).await?;
            Ok(keep)
        }
    }
}

/// Buffers a request body framed by `framing`, bounded as the router
/// bounds every body (size 413, all bodies 503, time 408; malformed or cut
/// 400); the outer error is the connection's. `go_on`: the client waits
/// for `100 Continue` before sending the body, written once its declared
/// length is known to fit.
async fn read_body<'r>(
    router: &'r EdgeRouter,
    connection: &mut Http1Connection,
    read: &mut BytesMut,
    framing: Framing,
    go_on: bool,
) -> std::io::Result<Result<(Bytes, Option<SemaphorePermit<'r>>), StatusCode>> {
    if framing == Framing::Empty {
        return Ok(Ok((Bytes::new(), None)));
    }
    let mut buffer = router.body_buffer();
    if let Framing::Length(len) = framing
        && let Err(status) = buffer.declare(len)
    {
        return Ok(Err(status));
    }
    if go_on {
        connection.io.write_all(h1::CONTINUE).await?;
    }
    let mut decoder = Decoder::new(framing);
    let collect = async {
        loop {
            match decoder.decode(read) {
                Ok(Decoded::Data(data)) => {
                    if let Err(status) = buffer.push(data) {
                        return Ok(Err(status));
                    }
                }
                Ok(Decoded::Done) => return Ok(Ok(())),
                Ok(Decoded::More) => {
                    if read_more(connection, read).await? == 0 {
                        return Ok(Err(StatusCode::BAD_REQUEST));
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, "request body refused");
                    return Ok(Err(StatusCode::BAD_REQUEST));
                }
            }
        }
    };
    let collected: std::io::Result<Result<(), StatusCode>> =
        match tokio::time::timeout(router.body_read_timeout(), collect).await {
            Ok(collected) => collected,
            Err(_) => Ok(Err(StatusCode::REQUEST_TIMEOUT)),
        };
    Ok(collected?.map(|()| buffer.finish()))
}

/// Writes the actor's response: its head, then its body as the actor
/// sends it, gathered into as few writes as it arrives in; whether the
/// connection can carry another request. A body that fails midway cuts the
/// response: the connection closes before its end.
async fn write_response(
    connection: &mut Http1Connection,
    write: &mut Vec<u8>,
    (head, mut body): (ResponseHead, PooledBody),
    request: &RequestHead<'_>,
    keep: bool,
) -> std::io::Result<bool> {
    let status = head.status;
    let bodyless = request.method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let sending = if bodyless {
        Sending::None
    } else if head.keeps_length() {
        Sending::Length
    } else if request.http11 {
        Sending::Chunked
    } else {
        Sending::Close
    };
    let keep = keep && sending != Sending::Close && !connection.is_closing();
    write.clear();
    let mut slots = h1::response_slots();
    let headers = Headers::Raw(head.parse(&mut slots));
    h1::encode_response(write, status, headers, sending, keep, request.http11);
    if sending == Sending::None {
        connection.io.write_all(write).await?;
        return Ok(keep);
    }
    loop {
        let polled = poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await;
        let frame = match polled {
            Poll::Ready(frame) => frame,
            // Nothing more yet: what is gathered goes now.
            Poll::Pending => {
                flush(connection, write).await?;
                poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
            }
        };
        match frame {
            None => break,
            Some(Ok(frame)) => {
                // Trailers never come: the pool drops them.
                if let Ok(data) = frame.into_data() {
                    if sending == Sending::Chunked {
                        h1::encode_chunk(write, &data);
                    } else {
                        write.extend_from_slice(&data);
                    }
                }
            }
            Some(Err(error)) => {
                tracing::debug!(%error, "actor's body failed: response cut");
                flush(connection, write).await?;
                return Ok(false);
            }
        }
        if write.len() >= WRITE_BYTES {
            flush(connection, write).await?;
        }
    }
    if sending == Sending::Chunked {
        write.extend_from_slice(h1::CHUNKED_END);
    }
    flush(connection, write).await?;
    Ok(keep)
}

/// Writes what is gathered in `write`, and empties it.
async fn flush(connection: &mut Http1Connection, write: &mut Vec<u8>) -> std::io::Result<()> {
    if !write.is_empty() {
        connection.io.write_all(write).await?;
        write.clear();
    }
    Ok(())
}

/// Writes the router's own JSON answer to `request`.
async fn write_refusal(
    connection: &mut Http1Connection,
    write: &mut Vec<u8>,
    refusal: Refusal,
    keep: bool,
    request: &RequestHead<'_>,
) -> std::io::Result<()> {
    let body = refusal.body.as_bytes();
    let head = request.method == Method::HEAD;
    let status = refusal.status;
    write_plain(connection, write, status, body, keep, request.http11, head).await
}

/// Writes an answer with a whole body (JSON if not empty); to a HEAD
/// request, its head alone (the length it would have, no body bytes: the
/// client reads none, and the next answer on the connection must follow).
async fn write_plain(
    connection: &mut Http1Connection,
    write: &mut Vec<u8>,
    status: StatusCode,
    body: &[u8],
    keep: bool,
    http11: bool,
    head: bool,
) -> std::io::Result<()> {
    let mut headers = HeaderMap::with_capacity(2);
    if !body.is_empty() {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let keep = keep && !connection.is_closing();
    write.clear();
    h1::encode_response(
        write,
        status,
        Headers::Map(&headers),
        Sending::Length,
        keep,
        http11,
    );
    if !head {
        write.extend_from_slice(body);
    }
    flush(connection, write).await
}
