//! `ActorPool`: the router's HTTP/1.1 connections to actors, parked per
//! actor between requests. A forward takes the most recently parked
//! connection of its actor (or dials one), writes the request on it and
//! reads the response head in the forward's own task ([`crate::h1`]: no
//! dispatcher task, no channel, no second wake-up per request); the
//! response body reads the rest as the client's connection polls it, and
//! parks the connection again once read to its end; a body dropped early
//! closes it. Per actor the pool keeps the dial address and the `Host`
//! header, so a request pays for neither a parse nor a format.
//!
//! A slot whose address lies outside the configured actor networks is kept
//! too, marked refused: the refusal is logged once per slot, not per request.
//!
//! Bounds: at most `actors_max` actors kept (when a new actor would pass
//! it, the actors not in use are evicted, those with no live parked
//! connection first, then the least recently parked, down to three quarters
//! of the bound; if every kept actor is in use, the new actor's connection
//! is not pooled), at most `idle_per_actor_max` parked connections per
//! actor, none taken after `idle_timeout` (swept when a connection is parked
//! or taken, so one may stay open longer — in CLOSE_WAIT if its actor closed
//! it — until the next park or take), each dial within `connect_timeout`.
//! Connections in use are bounded by the router's in-flight forwards until
//! their response heads arrive, then by the clients' connections. Each connection's read
//! buffer holds at most one response head ([`crate::h1`]'s bounds) plus
//! one read; its write buffer one request head and a body of up to
//! [`INLINE_BODY_BYTES_MAX`] (larger bodies are written from the request's
//! own bytes).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use hyper::Method;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::HeaderValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::warn;

use crate::h1::{self, Decoded, Decoder, Headers, ResponseHead};
use crate::network::ActorNetwork;

/// Request bodies up to this size are copied behind the head and sent in
/// one write; larger ones are written from the request's own bytes.
pub(crate) const INLINE_BODY_BYTES_MAX: usize = 16 * 1024;
/// Room made in a connection's read buffer before each read, in bytes.
const READ_BYTES: usize = 8 * 1024;
/// A write buffer grown past this (by a large head) is not kept for the next request.
const WRITE_BUFFER_KEEP_BYTES: usize = 64 * 1024;

/// A request to forward, as the router holds it: every attempt sends the
/// same, on whichever connection to whichever actor.
pub(crate) struct Outgoing<'a> {
    pub(crate) method: &'a Method,
    /// Origin form: the actor connection is the actor's own.
    pub(crate) path_and_query: &'a str,
    /// End-to-end headers: `Host` and `Content-Length` are the pool's.
    pub(crate) headers: Headers<'a>,
    /// Headers added (replacing any of the same name in `headers`).
    pub(crate) extra: &'a [h1::Extra<'a>],
    pub(crate) body: &'a Bytes,
}

/// Why a forward got no response.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The actor id is not `host:port` (or names no address).
    BadActor,
    /// The actor's address lies outside the configured actor networks.
    NotAllowed,
    /// No connection (refused, timed out): nothing was sent.
    Connect(String),
    /// The connection broke or the answer was malformed; `sent` if the
    /// request may have reached the actor.
    Broken { error: String, sent: bool },
}

/// How one exchange on one connection failed.
enum Failed {
    /// Not one byte of the request was written.
    Unsent(String),
    /// The request may have reached the actor.
    Sent(String),
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
    /// By actor id (an `ActorId`'s text).
    by_id: HashMap<Box<str>, Arc<Slot>>,
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
    conn: Conn,
    since: Instant,
}

/// One HTTP/1.1 connection to an actor, between or during exchanges.
struct Conn {
    stream: TcpStream,
    /// Bytes read and not yet taken: the rest of a response.
    read: BytesMut,
    /// The request being written; kept for the next one.
    write: Vec<u8>,
}

impl Conn {
    fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            read: BytesMut::new(),
            write: Vec::new(),
        }
    }

    /// Whether the actor has neither closed the connection nor sent
    /// anything unasked (either makes it unusable). Costs no system call
    /// unless the socket was seen readable since the last read.
    fn is_open(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Writes `request`, then reads up to the end of the response head.
    async fn exchange(
        mut self,
        host: &HeaderValue,
        request: &Outgoing<'_>,
    ) -> Result<(Conn, ResponseHead), Failed> {
        let body = request.body;
        self.write.clear();
        h1::encode_request(
            &mut self.write,
            request.method,
            request.path_and_query,
            host,
            request.headers,
            request.extra,
            body.len(),
        );
        let inline = body.len() <= INLINE_BODY_BYTES_MAX;
        if inline {
            self.write.extend_from_slice(body);
        }
        let mut written = 0;
        while written < self.write.len() {
            match self.stream.write(&self.write[written..]).await {
                Ok(n) if n > 0 => written += n,
                outcome => {
                    let error = match outcome {
                        Err(e) => format!("write: {e}"),
                        Ok(_) => "write: connection closed".to_string(),
                    };
                    return Err(if written == 0 {
                        Failed::Unsent(error)
                    } else {
                        Failed::Sent(error)
                    });
                }
            }
        }
        if !inline {
            self.stream
                .write_all(body)
                .await
                .map_err(|e| Failed::Sent(format!("write: {e}")))?;
        }
        if self.write.capacity() > WRITE_BUFFER_KEEP_BYTES {
            self.write = Vec::new();
        }
        let head_request = request.method == Method::HEAD;
        loop {
            match h1::parse_response(&mut self.read, head_request) {
                // A 2xx to CONNECT makes the connection a tunnel (RFC 9112
                // §6.3): never carry another request on it.
                Ok(Some(mut head)) if request.method == Method::CONNECT => {
                    head.keep_alive = false;
                    return Ok((self, head));
                }
                Ok(Some(head)) => return Ok((self, head)),
                Ok(None) => {}
                Err(e) => return Err(Failed::Sent(e.to_string())),
            }
            self.read.reserve(READ_BYTES);
            match self.stream.read_buf(&mut self.read).await {
                Ok(0) => {
                    return Err(Failed::Sent(
                        "the actor closed the connection before answering".to_string(),
                    ));
                }
                Ok(_) => {}
                Err(e) => return Err(Failed::Sent(format!("read: {e}"))),
            }
        }
    }
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

    /// Sends `request` to `actor` on a parked connection, or a new one. A
    /// parked connection that turns out closed before one byte of the
    /// request was written is replaced by a new connection, once, without
    /// counting as a failure.
    pub(crate) async fn send(
        self: &Arc<Self>,
        actor: &str,
        request: &Outgoing<'_>,
    ) -> Result<(ResponseHead, PooledBody), SendError> {
        let slot = self.slot(actor).ok_or(SendError::BadActor)?;
        if !slot.allowed {
            return Err(SendError::NotAllowed);
        }
        if let Some(conn) = self.take(&slot) {
            match conn.exchange(&slot.host, request).await {
                Ok((conn, head)) => return Ok(self.response(slot, conn, head)),
                Err(Failed::Unsent(_)) => {}
                Err(Failed::Sent(error)) => return Err(SendError::Broken { error, sent: true }),
            }
        }
        let conn = self.dial(&slot).await?;
        match conn.exchange(&slot.host, request).await {
            Ok((conn, head)) => Ok(self.response(slot, conn, head)),
            Err(Failed::Unsent(error)) => Err(SendError::Broken { error, sent: false }),
            Err(Failed::Sent(error)) => Err(SendError::Broken { error, sent: true }),
        }
    }

    /// The slot of `actor`, made on first use; `None` if its id is not an address.
    fn slot(&self, actor: &str) -> Option<Arc<Slot>> {
        let mut actors = lock(&self.actors);
        if let Some(slot) = actors.by_id.get(actor) {
            return Some(slot.clone());
        }
        let addr: SocketAddr = actor.parse().ok()?;
        let host = HeaderValue::from_str(actor).ok()?;
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
            actors.by_id.insert(actor.into(), slot.clone());
        }
        debug_assert!(actors.by_id.len() <= self.actors_max);
        Some(slot)
    }

    /// Makes room for new actors: drops those not in use, the ones without
    /// a live parked connection first, then the least recently parked, until
    /// three quarters of `actors_max` are left (so a burst of new actors
    /// pays for one pass per quarter of the bound, not one per actor).
    fn evict(&self, by_id: &mut HashMap<Box<str>, Arc<Slot>>) {
        let keep = self.actors_max - self.actors_max / 4;
        let now = Instant::now();
        let timeout = self.idle_timeout;
        by_id.retain(|_, slot| {
            let mut parked = lock(&slot.parked);
            parked.retain(|p| now.duration_since(p.since) <= timeout && p.conn.is_open());
            // A slot in use by a forward (another Arc) stays.
            !parked.is_empty() || Arc::strong_count(slot) > 1
        });
        if by_id.len() <= keep {
            return;
        }
        let mut idle: Vec<(Instant, Box<str>)> = by_id
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

    /// The most recently parked live connection of `slot`.
    fn take(&self, slot: &Slot) -> Option<Conn> {
        loop {
            let parked = lock(&slot.parked).pop()?;
            if parked.since.elapsed() <= self.idle_timeout && parked.conn.is_open() {
                return Some(parked.conn);
            }
        }
    }

    async fn dial(&self, slot: &Slot) -> Result<Conn, SendError> {
        let connect = TcpStream::connect(slot.addr);
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Err(_) => return Err(SendError::Connect("connect timed out".to_string())),
            Ok(Err(e)) => return Err(SendError::Connect(format!("connect: {e}"))),
            Ok(Ok(stream)) => stream,
        };
        let _ = stream.set_nodelay(true);
        Ok(Conn::new(stream))
    }

    /// The response's body, reading from `conn` (already complete, and
    /// `conn` parked, if the response has none).
    fn response(
        self: &Arc<Self>,
        slot: Arc<Slot>,
        conn: Conn,
        head: ResponseHead,
    ) -> (ResponseHead, PooledBody) {
        let mut body = PooledBody {
            conn: Some(conn),
            decoder: Decoder::new(head.framing),
            keep_alive: head.keep_alive,
            back: Some(Back {
                pool: self.clone(),
                slot,
            }),
        };
        // A response without a body is complete already.
        if body.decoder.is_done() {
            body.finish();
        }
        (head, body)
    }

    /// Parks `conn` on `slot` if there is room; sweeps old connections.
    fn park(&self, slot: &Slot, conn: Conn) {
        let now = Instant::now();
        {
            let mut parked = lock(&slot.parked);
            if parked.len() < self.idle_per_actor_max {
                parked.push(Parked { conn, since: now });
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
            parked.retain(|p| now.duration_since(p.since) <= timeout && p.conn.is_open());
            // A slot in use by a forward (another Arc) stays.
            !parked.is_empty() || Arc::strong_count(slot) > 1
        });
    }
}

/// Where a response body returns its connection.
struct Back {
    pool: Arc<ActorPool>,
    slot: Arc<Slot>,
}

/// An actor's response body, read from its connection as it is polled;
/// parks the connection once read to its end (a body dropped before its
/// end, or one that ends at the connection's close, closes it).
pub struct PooledBody {
    /// `None` once the body ended (parked or closed) or failed.
    conn: Option<Conn>,
    decoder: Decoder,
    keep_alive: bool,
    back: Option<Back>,
}

impl PooledBody {
    /// The body is complete: its connection goes back to the pool if it
    /// can carry another request.
    fn finish(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        // Bytes past the body's end were never asked for: not reusable.
        if self.keep_alive
            && conn.read.is_empty()
            && let Some(back) = self.back.take()
        {
            back.pool.park(&back.slot, conn);
        }
    }

    fn fail(
        &mut self,
        error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> std::io::Error {
        self.conn = None;
        std::io::Error::other(error)
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match this.decoder.decode(&mut conn.read) {
                Ok(Decoded::Data(data)) => {
                    if this.decoder.is_done() {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Decoded::Done) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Decoded::More) => {}
                Err(e) => return Poll::Ready(Some(Err(this.fail(e)))),
            }
            conn.read.reserve(READ_BYTES);
            if let Err(e) = ready!(conn.stream.poll_read_ready(cx)) {
                return Poll::Ready(Some(Err(this.fail(e))));
            }
            match conn.stream.try_read_buf(&mut conn.read) {
                Ok(0) => {
                    if let Err(e) = this.decoder.eof() {
                        return Poll::Ready(Some(Err(this.fail(e))));
                    }
                    // Ended by the close: nothing to park.
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Some(Err(this.fail(e)))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // The server may stop polling once the body says it is complete.
        if self.decoder.is_done() {
            self.finish();
        }
    }
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

    fn actor(port: u16) -> String {
        format!("127.0.0.1:{port}")
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
        assert!(!lock(&pool.actors).by_id.contains_key(actor(5).as_str()));
        drop(in_use);
        drop(extra);
        assert!(pool.slot(&actor(6)).is_some());
        let actors = lock(&pool.actors);
        assert!(
            actors.by_id.contains_key(actor(6).as_str()),
            "idle ones made room"
        );
        assert!(actors.by_id.len() <= ACTORS_MAX);
    }
}
