//! Accepting HTTP connections for the router and the actor host: HTTP/1.1
//! and HTTP/2 (prior knowledge) on one TCP listener, a bounded number of
//! connections at a time, each bounded in time and in what it may make the
//! server buffer (see [`ServeLimits`] and [`crate::connection`]), until
//! stopped; then in-flight requests get a bounded drain time and whatever is
//! left is dropped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper::{Request, Response};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, warn};

use crate::admission::Admission;
use crate::config::ServeLimits;
use crate::connection::{self, Builders, Http1Server};

/// Pause after a failed accept (e.g. out of file descriptors), in milliseconds.
const ACCEPT_BACKOFF_MS: u64 = 50;

/// The tokio runtime for a router or an actor host on `threads` threads.
/// One thread runs everything on a current-thread runtime: a request and
/// its forward wake each other without crossing threads (what one nginx
/// worker does); more make a multi-thread runtime with that many workers.
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
}

/// What a server's stop signal holds: `None` while running, then the drain
/// time in-flight requests get.
pub(crate) type StopSignal = Arc<watch::Sender<Option<Duration>>>;

/// A running HTTP server. Stop it with [`Serving::stop`]; dropped, it keeps
/// running until its owner's runtime ends.
#[derive(Debug)]
pub struct Serving {
    addr: SocketAddr,
    stop: StopSignal,
    admission: Arc<Admission>,
    /// `None` once awaited by [`Serving::stopped`].
    task: Option<JoinHandle<()>>,
}

impl Serving {
    /// The address it accepts on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections open now (admitted, not yet ended or evicted).
    pub fn connections_open(&self) -> usize {
        *self.admission.open().borrow()
    }

    /// The connections open, to watch (e.g. wait until a closed one is gone).
    pub fn connections(&self) -> watch::Receiver<usize> {
        self.admission.open()
    }

    /// Connections evicted so far: closed, before their first request, to
    /// make room for a new one at `connections_max`.
    pub fn connections_evicted(&self) -> u64 {
        self.admission.evicted()
    }

    /// Stops accepting, lets in-flight requests finish for up to `drain`,
    /// then drops every connection; returns when all are gone.
    pub async fn stop(self, drain: Duration) {
        self.stop.send_replace(Some(drain));
        if let Some(task) = self.task {
            let _ = task.await;
        }
    }

    /// Resolves once the server stopped (by [`Serving::stop`] or because its
    /// owner signalled, e.g. an actor's hard termination).
    pub async fn stopped(&mut self) {
        if let Some(task) = &mut self.task {
            let _ = task.await;
            self.task = None;
        }
    }
}

/// Serves `service` on `listener` in a task until `stop` holds a drain time.
pub(crate) fn spawn<S, B>(
    listener: TcpListener,
    service: S,
    http1: Option<Http1Server>,
    limits: ServeLimits,
    stop: StopSignal,
) -> std::io::Result<Serving>
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let addr = listener.local_addr()?;
    let admission = Arc::new(Admission::new(limits.connections_max));
    let task = tokio::spawn(accept_loop(
        listener,
        service,
        http1,
        limits,
        admission.clone(),
        stop.subscribe(),
    ));
    Ok(Serving {
        addr,
        stop,
        admission,
        task: Some(task),
    })
}

async fn accept_loop<S, B>(
    listener: TcpListener,
    service: S,
    http1: Option<Http1Server>,
    limits: ServeLimits,
    admission: Arc<Admission>,
    mut stop: watch::Receiver<Option<Duration>>,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let builders = Arc::new(Builders::new(&limits));
    let mut connections = JoinSet::new();
    let drain = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(ACCEPT_BACKOFF_MS)).await;
                        continue;
                    }
                };
                let Some(admitted) = admission.admit() else {
                    debug!(max = limits.connections_max, "connection limit reached, every connection busy: closing");
                    continue;
                };
                let _ = stream.set_nodelay(true);
                // The place is held until the connection's task ends.
                let served = connection::run(stream, builders.clone(), service.clone(), http1.clone(), stop.clone(), Arc::new(admitted));
                connections.spawn(served);
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            changed = stop.changed() => match changed {
                Ok(()) => if let Some(drain) = *stop.borrow() { break drain },
                // The owner is gone: stop without a drain.
                Err(_) => break Duration::ZERO,
            },
        }
    };
    drop(listener);
    // Each connection saw the stop and shuts down gracefully; dropping the
    // set aborts those still open after the drain.
    let _ = tokio::time::timeout(drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use hyper::body::Frame;
    use hyper::service::service_fn;
    use tokio::io::AsyncWriteExt;
    use tokio::sync::mpsc;

    /// The scenario must finish within this, in milliseconds.
    const TEST_MS_MAX: u64 = 20_000;
    /// The write timeout under test, in milliseconds.
    const WRITE_TIMEOUT_MS: u64 = 300;
    static CHUNK: [u8; 64 * 1024] = [b'x'; 64 * 1024];

    /// A response body that never ends; tells `dropped` when it is dropped.
    struct Endless {
        dropped: mpsc::UnboundedSender<()>,
    }

    impl Body for Endless {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&CHUNK)))))
        }
    }

    impl Drop for Endless {
        fn drop(&mut self) {
            let _ = self.dropped.send(());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_stops_reading_is_dropped_after_the_write_timeout_and_its_response_freed()
    {
        let (dropped_tx, mut dropped) = mpsc::unbounded_channel();
        let service = service_fn(move |_request| {
            let body = Endless {
                dropped: dropped_tx.clone(),
            };
            async move { Ok::<_, Infallible>(Response::new(body)) }
        });
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let limits = ServeLimits {
            write_timeout_ms: WRITE_TIMEOUT_MS,
            ..ServeLimits::default()
        };
        let (stop, _) = watch::channel(None);
        let serving = spawn(listener, service, None, limits, Arc::new(stop)).expect("serving");
        let mut client = tokio::net::TcpStream::connect(serving.local_addr())
            .await
            .expect("connect");
        client
            .write_all(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
            .await
            .expect("write the request");
        // The client never reads: the server's writes stall once the
        // socket buffers are full, and stay stalled.
        let mut connections = serving.connections();
        tokio::time::timeout(Duration::from_millis(TEST_MS_MAX), async {
            dropped.recv().await.expect("the body is dropped");
            connections
                .wait_for(|open| *open == 0)
                .await
                .expect("the server runs");
        })
        .await
        .expect("the stalled connection is dropped within TEST_MS_MAX");
        drop(client);
        serving.stop(Duration::ZERO).await;
    }
}
