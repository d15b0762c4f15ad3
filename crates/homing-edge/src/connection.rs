//! One accepted TCP connection, from its first byte to its close, for the
//! router and the actor host: the protocol is detected within a deadline
//! (the HTTP/2 preface, else HTTP/1.1), then hyper serves it (or, for
//! HTTP/1.1 on a listener with its own server side such as the router's, an
//! [`Http1Server`]) while this module watches it. A connection with no
//! request in flight for the idle timeout is shut down gracefully (HTTP/2:
//! GOAWAY; HTTP/1.1: closed between requests) and dropped if it has not
//! closed within [`IDLE_CLOSE_GRACE_MS`]; an HTTP/1 connection whose next
//! request head is not complete within the header read timeout (counted
//! from the end of the previous response, or from the connection's start)
//! is dropped; both are deadlines kept per connection, on one timer, not
//! per request. A stop signal shuts it down gracefully too. A connection
//! evicted before its first request (see [`crate::admission`]) is dropped
//! at once, and one whose client stops reading is dropped once a write has
//! made no progress for the write timeout.
//!
//! ```text
//!  accepted ──first bytes within detect_timeout──► HTTP/1.1 or HTTP/2 ──no request for idle_timeout──► GOAWAY / close ──grace──► dropped
//!      ├── silent or closed: dropped                    ├── stop: graceful shutdown (the server bounds the drain)
//!      └── evicted (no request yet): dropped            ├── evicted (no request yet): dropped
//!                                                       ├── HTTP/1: no request head within header_read_timeout: dropped
//!                                                       └── a write stalled for write_timeout: dropped
//! ```

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper::service::{Service, service_fn};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tracing::debug;

use crate::admission::Admitted;
use crate::config::{IDLE_CLOSE_GRACE_MS, ServeLimits};

/// What an HTTP/2 client sends first (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Most bytes read while detecting the protocol; all are replayed to hyper.
const DETECT_READ_BYTES_MAX: usize = 4096;

/// The protocol a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// hyper's connection builders, configured from [`ServeLimits`] once per listener.
pub(crate) struct Builders {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    detect_timeout: Duration,
    idle_timeout: Duration,
    header_read_timeout: Duration,
    write_timeout: Duration,
}

impl Builders {
    pub(crate) fn new(limits: &ServeLimits) -> Builders {
        let mut h1 = http1::Builder::new();
        // The header read timeout is kept by `watch_over`, one deadline per
        // connection: hyper's would arm a timer for every request.
        h1.header_read_timeout(None);
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .max_concurrent_streams(limits.h2_streams_max)
            .initial_stream_window_size(limits.h2_stream_window_bytes)
            .initial_connection_window_size(limits.h2_connection_window_bytes)
            .max_header_list_size(limits.h2_header_list_bytes_max)
            .max_send_buf_size(limits.h2_send_buffer_bytes_max);
        Builders {
            http1: h1,
            http2: h2,
            detect_timeout: Duration::from_millis(limits.detect_timeout_ms),
            idle_timeout: Duration::from_millis(limits.idle_timeout_ms),
            header_read_timeout: Duration::from_millis(limits.header_read_timeout_ms),
            write_timeout: Duration::from_millis(limits.write_timeout_ms),
        }
    }
}

/// An HTTP/1.1 server side of a listener's own, in place of hyper's: given
/// a connection (its protocol detected), serves it to its end. Watched
/// from outside like hyper's (idle, header read and write timeouts,
/// eviction, stop).
pub(crate) type Http1Server = Arc<
    dyn Fn(Http1Connection) -> Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>
        + Send
        + Sync,
>;

/// An HTTP/1.1 connection handed to an [`Http1Server`].
pub(crate) struct Http1Connection {
    /// The client's stream, the bytes read while detecting put back;
    /// writes fail once stalled for the write timeout.
    pub(crate) io: Prefixed,
    activity: Arc<Activity>,
    admitted: Arc<Admitted>,
    closing: Arc<AtomicBool>,
}

impl Http1Connection {
    /// A request head arrived: the connection is safe from eviction, and a
    /// request is in flight until the returned guard is dropped (after its
    /// response's last byte was written).
    pub(crate) fn request_started(&self) -> InFlight {
        self.admitted.requested();
        self.activity.start()
    }

    /// Whether the connection is shutting down (idle too long, or the
    /// server stopping): answer the request in flight with
    /// `connection: close`, then end.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }
}

/// A connection an [`Http1Server`] serves, as [`watch_over`] sees it: shut
/// down gracefully, it ends at once if no request is in flight, else after
/// the one in flight is answered.
struct OwnHttp1 {
    served: Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>,
    activity: Arc<Activity>,
    closing: Arc<AtomicBool>,
}

impl Future for OwnHttp1 {
    type Output = std::io::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.closing.load(Ordering::Acquire) && self.activity.quiet_since().is_some() {
            return Poll::Ready(Ok(()));
        }
        self.served.as_mut().poll(cx)
    }
}

/// A connection [`watch_over`] can shut down gracefully.
trait Watched: Future<Output = Result<(), Self::Error>> {
    type Error: std::fmt::Display;
    fn shut_down(self: Pin<&mut Self>);
}

impl Watched for OwnHttp1 {
    type Error = std::io::Error;

    fn shut_down(self: Pin<&mut Self>) {
        self.closing.store(true, Ordering::Release);
    }
}

impl<C: GracefulConnection> Watched for C
where
    C::Error: std::fmt::Display,
{
    type Error = C::Error;

    fn shut_down(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Serves one accepted connection until it closes, is idle too long, is
/// evicted before its first request, stalls a write too long, or the server
/// stops (`stop` holds a drain time; the server bounds the drain). HTTP/1.1
/// goes to `http1` if given, else to hyper with `service`.
pub(crate) async fn run<S, B>(
    mut stream: TcpStream,
    builders: Arc<Builders>,
    service: S,
    http1: Option<Http1Server>,
    mut stop: watch::Receiver<Option<std::time::Duration>>,
    admitted: Arc<Admitted>,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = std::convert::Infallible>
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let detected = tokio::select! {
        detected = tokio::time::timeout(builders.detect_timeout, detect(&mut stream)) => detected,
        _ = stop.changed() => return,
        () = admitted.evicted() => {
            debug!("evicted before its first bytes: closing");
            return;
        }
    };
    let (protocol, prefix) = match detected {
        Ok(Ok(detected)) => detected,
        Ok(Err(error)) => {
            debug!(%error, "connection closed before its protocol was known");
            return;
        }
        Err(_) => {
            debug!(
                timeout_ms = builders.detect_timeout.as_millis() as u64,
                "no request within the detect timeout: closing"
            );
            return;
        }
    };
    let io = Prefixed::new(prefix, stream, builders.write_timeout);
    let activity = Arc::new(Activity::new());
    let idle = builders.idle_timeout;
    if let (Protocol::Http1, Some(http1)) = (protocol, http1) {
        let closing = Arc::new(AtomicBool::new(false));
        let served = http1(Http1Connection {
            io,
            activity: activity.clone(),
            admitted: admitted.clone(),
            closing: closing.clone(),
        });
        let connection = OwnHttp1 {
            served,
            activity: activity.clone(),
            closing,
        };
        let quiet = Quiet {
            idle,
            head: Some(builders.header_read_timeout),
        };
        watch_over(connection, &activity, quiet, stop, &admitted).await;
        return;
    }
    let io = TokioIo::new(io);
    let tracked = activity.clone();
    let requested = admitted.clone();
    let service = service_fn(move |request| {
        requested.requested();
        let guard = tracked.start();
        let answer = service.call(request);
        async move {
            let response = answer.await?;
            Ok::<_, std::convert::Infallible>(response.map(|body| Tracked {
                body,
                _guard: guard,
            }))
        }
    });
    match protocol {
        Protocol::Http1 => {
            let connection = builders.http1.serve_connection(io, service);
            let quiet = Quiet {
                idle,
                head: Some(builders.header_read_timeout),
            };
            watch_over(connection, &activity, quiet, stop, &admitted).await;
        }
        Protocol::Http2 => {
            let connection = builders.http2.serve_connection(io, service);
            let quiet = Quiet { idle, head: None };
            watch_over(connection, &activity, quiet, stop, &admitted).await;
        }
    }
}

/// Reads the first bytes of a connection until they tell HTTP/2's preface
/// from anything else (taken as HTTP/1.1); returns them for replay.
async fn detect(stream: &mut TcpStream) -> std::io::Result<(Protocol, Bytes)> {
    let mut read = Vec::with_capacity(DETECT_READ_BYTES_MAX);
    loop {
        if stream.read_buf(&mut read).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let seen = read.len().min(H2_PREFACE.len());
        if read[..seen] != H2_PREFACE[..seen] {
            return Ok((Protocol::Http1, Bytes::from(read)));
        }
        if seen == H2_PREFACE.len() {
            return Ok((Protocol::Http2, Bytes::from(read)));
        }
    }
}

/// How long a connection may go without a request in flight.
#[derive(Debug, Clone, Copy)]
struct Quiet {
    /// Then it is shut down gracefully.
    idle: Duration,
    /// HTTP/1 only: then it is dropped, the next request head not (fully)
    /// read. One deadline per connection, looked at when the connection's
    /// one timer fires, in place of a timer per request.
    head: Option<Duration>,
}

impl Quiet {
    fn shortest(&self) -> Duration {
        self.head.map_or(self.idle, |head| head.min(self.idle))
    }
}

/// Polls `connection` to its end; shuts it down when idle or stopped, drops
/// it when an HTTP/1 request head is not read in time or when evicted
/// (which only happens before its first request).
async fn watch_over<C: Watched>(
    connection: C,
    activity: &Activity,
    quiet: Quiet,
    mut stop: watch::Receiver<Option<Duration>>,
    admitted: &Admitted,
) {
    let mut connection = pin!(connection);
    let timer = tokio::time::sleep(quiet.shortest());
    let mut timer = pin!(timer);
    let mut shut_down = false;
    let mut watching_stop = true;
    loop {
        // In order, without drawing a random start per wake-up: the
        // connection is what wakes the task for almost every request.
        tokio::select! {
            biased;
            ended = connection.as_mut() => {
                if let Err(error) = ended {
                    debug!(%error, "connection ended with an error");
                }
                return;
            }
            () = admitted.evicted() => {
                debug!("evicted before its first request: dropped");
                return;
            }
            () = timer.as_mut() => {
                let now = Instant::now();
                let since = activity.quiet_since();
                let head_due = quiet.head.zip(since).map(|(head, since)| since + head);
                if head_due.is_some_and(|due| due <= now) {
                    debug!(
                        timeout_ms = quiet.head.unwrap_or_default().as_millis() as u64,
                        "no request head within the header read timeout: dropped"
                    );
                    return;
                }
                match since.map(|since| since + quiet.idle) {
                    // A request in flight: look again later.
                    None => timer.as_mut().reset(now + quiet.shortest()),
                    Some(due) if due > now => {
                        timer.as_mut().reset(head_due.map_or(due, |head| head.min(due)));
                    }
                    Some(_) if !shut_down => {
                        debug!(idle_ms = quiet.idle.as_millis() as u64, "idle: shutting down");
                        connection.as_mut().shut_down();
                        shut_down = true;
                        timer.as_mut().reset(now + Duration::from_millis(IDLE_CLOSE_GRACE_MS));
                    }
                    Some(_) => {
                        debug!("idle and not closed after the grace: dropped");
                        return;
                    }
                }
            }
            changed = stop.changed(), if watching_stop => {
                watching_stop = false;
                if changed.is_ok() && stop.borrow().is_some() && !shut_down {
                    connection.as_mut().shut_down();
                    shut_down = true;
                }
            }
        }
    }
}

/// Requests in flight on one connection, and when the last one ended.
struct Activity {
    born: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `born` at which the last request ended.
    last_end_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            born: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_end_ms: AtomicU64::new(0),
        }
    }

    fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// When the connection last had no request in flight: the end of its
    /// last request, or its start; `None` while a request is in flight.
    fn quiet_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.born + Duration::from_millis(self.last_end_ms.load(Ordering::Acquire)))
    }
}

/// One request in flight: from the service call to the end of its response
/// body (or the drop of either).
pub(crate) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let ms = self.0.born.elapsed().as_millis() as u64;
        self.0.last_end_ms.fetch_max(ms, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::Release);
    }
}

/// A response body that keeps its request in flight until it is dropped.
struct Tracked<B> {
    body: B,
    /// Held for its drop.
    _guard: InFlight,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A TCP stream with the bytes read while detecting its protocol put back,
/// whose writes fail with `TimedOut` once one has made no progress for the
/// write timeout (a client that stopped reading): hyper then drops the
/// connection and what it buffered for it.
pub(crate) struct Prefixed {
    prefix: Bytes,
    stream: TcpStream,
    write_timeout: Duration,
    /// Armed while a write is stalled: when it fires, the write fails.
    stalled: Pin<Box<Sleep>>,
    armed: bool,
}

impl Prefixed {
    fn new(prefix: Bytes, stream: TcpStream, write_timeout: Duration) -> Prefixed {
        Prefixed {
            prefix,
            stream,
            write_timeout,
            stalled: Box::pin(tokio::time::sleep(write_timeout)),
            armed: false,
        }
    }

    /// Passes a finished write through (disarming the stall timer); a
    /// pending one arms it, and fails once it fired.
    fn watch_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if polled.is_ready() {
            self.armed = false;
            return polled;
        }
        if !self.armed {
            self.armed = true;
            let deadline = Instant::now() + self.write_timeout;
            self.stalled.as_mut().reset(deadline);
        }
        match self.stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client read nothing for the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.prefix.is_empty() {
            return Pin::new(&mut self.stream).poll_read(cx, buf);
        }
        let n = self.prefix.len().min(buf.remaining());
        buf.put_slice(&self.prefix[..n]);
        self.prefix.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.watch_write(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.watch_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.watch_write(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn detect_tells_the_h2_preface_from_http1_and_keeps_every_byte() {
        for (sent, protocol) in [
            (&b"GET / HTTP/1.1\r\n\r\n"[..], Protocol::Http1),
            (&H2_PREFACE[..], Protocol::Http2),
            (&b"PRI * HTTP/1.1\r\n"[..], Protocol::Http1),
        ] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind loopback");
            let addr = listener.local_addr().expect("bound");
            let mut client = TcpStream::connect(addr).await.expect("connect");
            let (mut server, _) = listener.accept().await.expect("accept");
            tokio::io::AsyncWriteExt::write_all(&mut client, sent)
                .await
                .expect("write");
            let (detected, prefix) = detect(&mut server).await.expect("detected");
            assert_eq!(detected, protocol);
            assert!(sent.starts_with(&prefix), "prefix is what was sent");
        }
    }
}
