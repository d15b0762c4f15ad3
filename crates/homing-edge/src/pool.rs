//! `ActorPool`: the router's HTTP/1.1 connections to actors, parked per
//! actor between requests. A forward takes the most recently parked
//! connection of its actor (or dials one), sends on it, and the response
//! body parks the connection again once it has been read to its end; a body
//! dropped early closes it. Per actor the pool keeps the dial address and
//! the `Host` header, so a request pays for neither a parse nor a format.
//!
//! A slot whose address lies outside the configured actor networks is kept
//! too, marked refused: the refusal is logged once per slot, not per request.
//!
//! Bounds: at most `actors_max` actors kept (when a new actor would pass
//! it, the actors not in use are evicted, those with no live parked
//! connection first, then the least recently parked, down to three quarters
//! of the bound; if every kept actor is in use, the new actor's connection
//! is not pooled), at most `idle_per_actor_max` parked connections per
//! actor, none parked longer than `idle_timeout` (swept when a connection is
//! parked or taken), each dial within `connect_timeout`. Connections in use
//! are bounded by the router's in-flight forwards.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use homing_core::ActorId;
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::HeaderValue;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tracing::{debug, warn};

use crate::network::ActorNetwork;

/// What an actor connection sends: the router buffers bodies (to retry).
pub(crate) type ActorRequest = Request<Full<Bytes>>;

/// Why a forward got no response.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The actor id is not `host:port` (or names no address).
    BadActor,
    /// The actor's address lies outside the configured actor networks.
    NotAllowed,
    /// No connection (refused, timed out, handshake failed): nothing was sent.
    Connect(String),
    /// The connection broke; `sent` if the request may have reached the actor.
    Broken { error: String, sent: bool },
}

/// Connections to actors. See the module docs.
pub(crate) struct ActorPool {
    actors: Mutex<Actors>,
    actors_max: usize,
    idle_per_actor_max: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    networks: Vec<ActorNetwork>,
}

struct Actors {
    by_id: HashMap<ActorId, Arc<Slot>>,
    /// When parked connections were last swept for age.
    swept: Instant,
}

/// One actor: where to dial it, its `Host` header, its parked connections.
struct Slot {
    addr: SocketAddr,
    /// Whether `addr` lies in an actor network.
    allowed: bool,
    host: HeaderValue,
    parked: Mutex<Vec<Parked>>,
}

struct Parked {
    sender: SendRequest<Full<Bytes>>,
    since: Instant,
}

/// Locks `mutex`; a panic while it was held left only a connection list
/// behind, which is still usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ActorPool {
    pub(crate) fn new(
        actors_max: usize,
        idle_per_actor_max: usize,
        idle_timeout: Duration,
        connect_timeout: Duration,
        networks: Vec<ActorNetwork>,
    ) -> ActorPool {
        ActorPool {
            actors: Mutex::new(Actors {
                by_id: HashMap::new(),
                swept: Instant::now(),
            }),
            actors_max,
            idle_per_actor_max,
            idle_timeout,
            connect_timeout,
            networks,
        }
    }

    /// Sends `request` (origin-form URI, any `Host` is replaced) to `actor`
    /// on a parked connection, or a new one. A parked connection that the
    /// actor closed before the request was written is replaced by a new
    /// connection, once, without counting as a failure.
    pub(crate) async fn send(
        self: &Arc<Self>,
        actor: &ActorId,
        mut request: ActorRequest,
    ) -> Result<Response<PooledBody>, SendError> {
        let slot = self.slot(actor).ok_or(SendError::BadActor)?;
        if !slot.allowed {
            return Err(SendError::NotAllowed);
        }
        request
            .headers_mut()
            .insert(hyper::header::HOST, slot.host.clone());
        if let Some(mut sender) = self.take(&slot).await {
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(self.wrap(slot, sender, response)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => request = unsent,
                    None => {
                        return Err(SendError::Broken {
                            error: error_chain(e.error()),
                            sent: true,
                        });
                    }
                },
            }
        }
        let mut sender = self.dial(&slot).await?;
        match sender.try_send_request(request).await {
            Ok(response) => Ok(self.wrap(slot, sender, response)),
            Err(e) => Err(SendError::Broken {
                error: error_chain(e.error()),
                sent: e.message().is_none(),
            }),
        }
    }

    /// The slot of `actor`, made on first use; `None` if its id is not an address.
    fn slot(&self, actor: &ActorId) -> Option<Arc<Slot>> {
        let mut actors = lock(&self.actors);
        if let Some(slot) = actors.by_id.get(actor) {
            return Some(slot.clone());
        }
        let addr: SocketAddr = actor.as_str().parse().ok()?;
        let host = HeaderValue::from_str(actor.as_str()).ok()?;
        let allowed = self.networks.iter().any(|n| n.contains(addr.ip()));
        if !allowed {
            warn!(%actor, "actor address outside the actor networks: not forwarding to it");
        }
        let slot = Arc::new(Slot {
            addr,
            allowed,
            host,
            parked: Mutex::new(Vec::new()),
        });
        if actors.by_id.len() >= self.actors_max {
            self.evict(&mut actors.by_id);
        }
        // Every kept actor is in use: this one's connection is not pooled.
        if actors.by_id.len() < self.actors_max {
            actors.by_id.insert(actor.clone(), slot.clone());
        }
        debug_assert!(actors.by_id.len() <= self.actors_max);
        Some(slot)
    }

    /// Makes room for new actors: drops those not in use, the ones without
    /// a live parked connection first, then the least recently parked, until
    /// three quarters of `actors_max` are left (so a burst of new actors
    /// pays for one pass per quarter of the bound, not one per actor).
    fn evict(&self, by_id: &mut HashMap<ActorId, Arc<Slot>>) {
        let keep = self.actors_max - self.actors_max / 4;
        let now = Instant::now();
        let timeout = self.idle_timeout;
        by_id.retain(|_, slot| {
            let mut parked = lock(&slot.parked);
            parked.retain(|p| now.duration_since(p.since) <= timeout && !p.sender.is_closed());
            // A slot in use by a forward (another Arc) stays.
            !parked.is_empty() || Arc::strong_count(slot) > 1
        });
        if by_id.len() <= keep {
            return;
        }
        let mut idle: Vec<(Instant, ActorId)> = by_id
            .iter()
            .filter(|(_, slot)| Arc::strong_count(slot) == 1)
            .map(|(id, slot)| {
                let last = lock(&slot.parked).iter().map(|p| p.since).max();
                (last.unwrap_or(now), id.clone())
            })
            .collect();
        let excess = (by_id.len() - keep).min(idle.len());
        if excess == 0 {
            return;
        }
        idle.select_nth_unstable(excess - 1);
        for (_, id) in &idle[..excess] {
            by_id.remove(id);
        }
    }

    /// The most recently parked live connection of `slot`, ready to send.
    async fn take(&self, slot: &Slot) -> Option<SendRequest<Full<Bytes>>> {
        loop {
            let parked = lock(&slot.parked).pop()?;
            if parked.since.elapsed() > self.idle_timeout || parked.sender.is_closed() {
                continue;
            }
            let mut sender = parked.sender;
            // Its previous response may have ended an instant ago: the
            // connection turns ready once its task has seen that.
            if sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    async fn dial(&self, slot: &Slot) -> Result<SendRequest<Full<Bytes>>, SendError> {
        let connect = TcpStream::connect(slot.addr);
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Err(_) => return Err(SendError::Connect("connect timed out".to_string())),
            Ok(Err(e)) => return Err(SendError::Connect(format!("connect: {e}"))),
            Ok(Ok(stream)) => stream,
        };
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| SendError::Connect(error_chain(&e)))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(%error, "actor connection ended with an error");
            }
        });
        Ok(sender)
    }

    fn wrap(
        self: &Arc<Self>,
        slot: Arc<Slot>,
        sender: SendRequest<Full<Bytes>>,
        response: Response<Incoming>,
    ) -> Response<PooledBody> {
        let pool = self.clone();
        response.map(|body| PooledBody {
            body,
            back: Some(Back { pool, slot, sender }),
        })
    }

    /// Parks `sender` on `slot` if there is room; sweeps old connections.
    fn park(&self, slot: &Slot, sender: SendRequest<Full<Bytes>>) {
        let now = Instant::now();
        {
            let mut parked = lock(&slot.parked);
            if parked.len() < self.idle_per_actor_max && !sender.is_closed() {
                parked.push(Parked { sender, since: now });
            }
        }
        let mut actors = lock(&self.actors);
        if now.duration_since(actors.swept) < self.idle_timeout {
            return;
        }
        actors.swept = now;
        let timeout = self.idle_timeout;
        actors.by_id.retain(|_, slot| {
            let mut parked = lock(&slot.parked);
            parked.retain(|p| now.duration_since(p.since) <= timeout && !p.sender.is_closed());
            // A slot in use by a forward (another Arc) stays.
            !parked.is_empty() || Arc::strong_count(slot) > 1
        });
    }
}

/// Where a response body returns its connection.
struct Back {
    pool: Arc<ActorPool>,
    slot: Arc<Slot>,
    sender: SendRequest<Full<Bytes>>,
}

impl Back {
    fn park(self) {
        self.pool.park(&self.slot, self.sender);
    }
}

/// An actor's response body, streamed; parks its connection once read to
/// its end (a body dropped before its end closes the connection).
pub struct PooledBody {
    body: Incoming,
    back: Option<Back>,
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.park(),
            Poll::Ready(Some(Ok(_))) if self.body.is_end_stream() => self.park(),
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl PooledBody {
    fn park(&mut self) {
        if let Some(back) = self.back.take() {
            back.park();
        }
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // The server may stop polling once the body says it is complete.
        if self.body.is_end_stream() {
            self.park();
        }
    }
}

pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(actors_max: usize) -> ActorPool {
        ActorPool::new(
            actors_max,
            4,
            Duration::from_secs(30),
            Duration::from_secs(1),
            ActorNetwork::defaults(),
        )
    }

    fn actor(port: u16) -> ActorId {
        ActorId::new(format!("127.0.0.1:{port}")).expect("an actor id")
    }

    #[test]
    fn actors_kept_stay_within_actors_max_however_many_are_seen() {
        const ACTORS_MAX: usize = 8;
        let pool = pool(ACTORS_MAX);
        for port in 1..=1_000 {
            assert!(pool.slot(&actor(port)).is_some());
            assert!(lock(&pool.actors).by_id.len() <= ACTORS_MAX);
        }
    }

    #[test]
    fn an_actor_in_use_is_not_evicted_and_a_new_one_past_the_bound_is_served_unpooled() {
        const ACTORS_MAX: usize = 4;
        let pool = pool(ACTORS_MAX);
        let in_use: Vec<Arc<Slot>> = (1..=4)
            .map(|port| pool.slot(&actor(port)).expect("a slot"))
            .collect();
        let extra = pool.slot(&actor(5)).expect("served all the same");
        let kept = lock(&pool.actors).by_id.len();
        assert_eq!(kept, ACTORS_MAX, "the four in use stay");
        assert!(!lock(&pool.actors).by_id.contains_key(&actor(5)));
        drop(in_use);
        drop(extra);
        assert!(pool.slot(&actor(6)).is_some());
        let actors = lock(&pool.actors);
        assert!(actors.by_id.contains_key(&actor(6)), "idle ones made room");
        assert!(actors.by_id.len() <= ACTORS_MAX);
    }
}
