//! Accepting HTTP connections for the router and the actor host: HTTP/1.1
//! and HTTP/2 (prior knowledge) on one TCP listener, a bounded number of
//! connections at a time, until stopped; then in-flight requests get a
//! bounded drain time and whatever is left is dropped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, warn};

/// Default most connections served at once; more are closed on accept.
pub const CONNECTIONS_MAX_DEFAULT: usize = 10_000;
/// Default time an HTTP/1 client has to send a request's headers, in milliseconds.
pub const HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Pause after a failed accept (e.g. out of file descriptors), in milliseconds.
const ACCEPT_BACKOFF_MS: u64 = 50;

/// Bounds of a listening side.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Most connections served at once.
    pub connections_max: usize,
    /// Time an HTTP/1 client has to send a request's headers, in milliseconds.
    pub header_read_timeout_ms: u64,
}

impl Default for ServeLimits {
    fn default() -> ServeLimits {
        ServeLimits {
            connections_max: CONNECTIONS_MAX_DEFAULT,
            header_read_timeout_ms: HEADER_READ_TIMEOUT_MS_DEFAULT,
        }
    }
}

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
    /// `None` once awaited by [`Serving::stopped`].
    task: Option<JoinHandle<()>>,
}

impl Serving {
    /// The address it accepts on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
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
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let addr = listener.local_addr()?;
    let task = tokio::spawn(accept_loop(listener, service, limits, stop.subscribe()));
    Ok(Serving {
        addr,
        stop,
        task: Some(task),
    })
}

async fn accept_loop<S, B>(
    listener: TcpListener,
    service: S,
    limits: ServeLimits,
    mut stop: watch::Receiver<Option<Duration>>,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms));
    let permits = Arc::new(Semaphore::new(limits.connections_max));
    let graceful = GracefulShutdown::new();
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
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    debug!(max = limits.connections_max, "connection limit reached: closing");
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let connection = builder
                    .serve_connection(TokioIo::new(stream), service.clone())
                    .into_owned();
                let connection = graceful.watch(connection);
                connections.spawn(async move {
                    if let Err(error) = connection.await {
                        debug!(error = %error, "connection ended with an error");
                    }
                    drop(permit);
                });
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
    // Dropping the set aborts connections still open after the drain.
    let _ = tokio::time::timeout(drain, graceful.shutdown()).await;
}
