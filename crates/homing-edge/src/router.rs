//! `EdgeRouter`: the reverse proxy. Per request: find the key, resolve it
//! (one cache lookup when hot), forward to the actor's address, stream the
//! answer back. A forward that cannot reach the actor reports the answer
//! unreachable and is retried once on a fresh resolve; a vacant tail (an
//! actor moving between DCs) is waited for, boundedly.
//!
//! The router's own answers carry `{"error":<reason>,"key":…}`:
//!
//! | reason | status | when |
//! |---|---|---|
//! | `no_key`, `bad_key` | 400 | no key header or `/k/<key>/` path; an invalid name |
//! | `body_too_large` | 413 | the body exceeds `request_body_bytes_max` |
//! | `overloaded` | 503 | buffering the body would exceed `request_bodies_bytes_max` (all requests together) |
//! | `body_timeout` | 408 | the body did not arrive within `body_read_timeout_ms` |
//! | `not_found` | 404 | [`ResolveError::NotFound`]: never reserved |
//! | `unavailable` (+ `"dc"`) | 503 | [`ResolveError::Unavailable`] (at once while the DC is suspect) |
//! | `vacant` | 503 | [`ResolveError::Vacant`] for longer than `move_wait_ms` |
//! | `inconsistent`, `chain_too_long` | 502 | [`ResolveError::Inconsistent`], [`ResolveError::ChainTooLong`] |
//! | `actor_not_allowed` | 502 | the actor's address lies outside `actor_networks` |
//! | `actor_unreachable`, `bad_actor_address` | 502 | the forward failed after the retry; the actor id is not `host:port` |
//! | `upstream_timeout` | 504 | no response headers within `upstream_timeout_ms` |

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use homing_client::{ResolveError, Resolved, Resolver};
use homing_core::KeyRef;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::{EdgeConfig, MOVE_POLL_MS};
use crate::h1::{DECIMAL_BYTES_MAX, Extra, HOP_BY_HOP, Headers, ResponseHead, decimal};
use crate::json;
use crate::pool::{ActorPool, Outgoing, PooledBody, SendError};
use crate::request_counts::EdgeMetrics;
use crate::route::{KeyError, route_parts};

/// Forwards per request: the first, and one retry after a fresh resolve.
pub const FORWARD_ATTEMPTS_MAX: u32 = 2;
/// Header telling the actor which DC the router resolved.
pub const DC_HEADER: &str = "x-homing-dc";
/// Header telling the actor which reservation the router resolved.
pub const RESERVATION_HEADER: &str = "x-homing-reservation";
/// Header telling the actor the fencing token the router resolved.
pub const TOKEN_HEADER: &str = "x-homing-token";

/// The body of every response the router sends: the actor's, streamed, or
/// the router's own short JSON.
pub type EdgeBody = BoxBody<Bytes, std::io::Error>;

/// The identifying headers, as names.
const IDENTITY_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static(DC_HEADER),
    HeaderName::from_static(RESERVATION_HEADER),
    HeaderName::from_static(TOKEN_HEADER),
];

/// Counters of what the router did, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EdgeStats {
    /// Requests received.
    pub requests: u64,
    /// Requests answered by their actor.
    pub forwarded: u64,
    /// Resolves answered from the Resolver's answer cache.
    pub resolved_from_cache: u64,
    /// Resolves that walked the chain (round trips to DCs).
    pub resolved_by_walk: u64,
    /// Resolves answered with a remembered answer, marked stale, because a
    /// DC was unavailable (with `stale_answers` only; also counted in
    /// `resolved_from_cache`).
    pub resolved_stale: u64,
    /// Requests answered 503 `unavailable` at once because their DC was
    /// suspect (not asked: it let a request time out and has not answered
    /// a probe since).
    pub unavailable_suspect: u64,
    /// DCs the resolver holds suspect now (a gauge).
    pub dcs_suspect: u64,
    /// Times a DC became suspect (each also logged once, as is its recovery).
    pub dc_suspicions: u64,
    /// Forwards retried after the actor was unreachable.
    pub retries: u64,
    /// Responses the router made itself with a 4xx/5xx status.
    pub failures: u64,
    /// Requests refused because their actor's address lies outside the
    /// actor networks (each such actor is also logged once).
    pub actors_not_allowed: u64,
    /// Request body bytes buffered now, over all requests (a gauge, under
    /// `request_bodies_bytes_max`).
    pub body_bytes_buffered: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    resolved_from_cache: AtomicU64,
    resolved_by_walk: AtomicU64,
    resolved_stale: AtomicU64,
    unavailable_suspect: AtomicU64,
    retries: AtomicU64,
    failures: AtomicU64,
    actors_not_allowed: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

struct Inner {
    resolver: Resolver,
    config: EdgeConfig,
    pool: Arc<ActorPool>,
    forwards: Semaphore,
    /// Request body bytes buffered, over all requests: one permit a byte.
    bodies: Semaphore,
    /// The permits `bodies` started with.
    bodies_bytes_max: usize,
    counters: Counters,
    /// Refusals by reason and the upstream latency, for `/metrics`.
    metrics: EdgeMetrics,
}

/// The edge router. Cheap to clone; clones share the resolver, the actor
/// connection pool and the counters.
#[derive(Clone)]
pub struct EdgeRouter {
    inner: Arc<Inner>,
}

/// Why one forward failed.
enum Forward {
    /// No connection, or it broke before an answer: the actor may be gone.
    /// `sent` if the request may have reached the actor (not a connect error).
    Unreachable { error: String, sent: bool },
    /// No response headers within the upstream timeout.
    Timeout,
    /// The actor id is not a `host:port` this router can dial.
    BadActor(String),
    /// The actor's address lies outside the actor networks.
    NotAllowed,
}

// Putting the router on a listener (`spawn`, `run`) is front.rs's, with
// the HTTP/1.1 server side it starts: the front uses the router, not the
// other way round.
impl EdgeRouter {
    /// A router resolving through `resolver` (built with a router identity).
    pub fn new(resolver: Resolver, config: EdgeConfig) -> EdgeRouter {
        let pool = ActorPool::new(
            config.pool_actors_max,
            config.pool_idle_per_actor_max,
            Duration::from_millis(config.pool_idle_timeout_ms),
            Duration::from_millis(config.connect_timeout_ms),
            config.actor_networks.clone(),
        );
        let bodies_bytes_max = config.request_bodies_bytes_max.min(Semaphore::MAX_PERMITS);
        EdgeRouter {
            inner: Arc::new(Inner {
                resolver,
                forwards: Semaphore::new(config.forwards_in_flight_max),
                bodies: Semaphore::new(bodies_bytes_max),
                bodies_bytes_max,
                config,
                pool: Arc::new(pool),
                counters: Counters::default(),
                metrics: EdgeMetrics::default(),
            }),
        }
    }

    /// The resolver it routes with.
    pub fn resolver(&self) -> &Resolver {
        &self.inner.resolver
    }

    /// Its refusals by reason and upstream latency (served by the `metrics` module).
    pub(crate) fn metrics(&self) -> &EdgeMetrics {
        &self.inner.metrics
    }

    /// What it did so far.
    pub fn stats(&self) -> EdgeStats {
        let c = &self.inner.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let resolver = self.inner.resolver.stats();
        EdgeStats {
            requests: get(&c.requests),
            forwarded: self.inner.metrics.forwarded_total(),
            resolved_from_cache: get(&c.resolved_from_cache),
            resolved_by_walk: get(&c.resolved_by_walk),
            resolved_stale: get(&c.resolved_stale),
            unavailable_suspect: get(&c.unavailable_suspect),
            dcs_suspect: resolver.dcs_suspect,
            dc_suspicions: resolver.suspicions,
            retries: get(&c.retries),
            failures: get(&c.failures),
            actors_not_allowed: get(&c.actors_not_allowed),
            body_bytes_buffered: (self.inner.bodies_bytes_max
                - self.inner.bodies.available_permits()) as u64,
        }
    }

    /// Routes one request; every failure is a response (see the module docs
    /// for the statuses), never an error. HTTP/2 requests come here (and
    /// HTTP/1.1 ones on a listener without the router's own HTTP/1.1
    /// server side).
    pub async fn handle(&self, request: Request<Incoming>) -> Response<EdgeBody> {
        self.count_request();
        let (mut parts, body) = request.into_parts();
        // Owned: the headers are changed below (HTTP/2 allocates per request
        // anyway; HTTP/1.1's own server side borrows).
        let (key, path_and_query) =
            match route_parts(&parts.headers, &parts.uri, &self.inner.config) {
                Ok(routed) => (routed.key.to_key(), routed.path_and_query.into_owned()),
                Err(e) => return self.unroutable(&e).response(),
            };
        let key = key.borrowed();
        // Hop-by-hop headers and Host go now, once for every attempt.
        strip_hop_by_hop(&mut parts.headers);
        // The body's bytes stay counted until the answer is on its way.
        let (body, _buffered) = match self.read_body(&parts.headers, body).await {
            Ok(read) => read,
            Err(status) => return self.refuse_body(status, key).response(),
        };
        let headers = Headers::Map(&parts.headers);
        match self
            .deliver(key, &parts.method, &path_and_query, headers, &body)
            .await
        {
            Ok((head, body)) => {
                let mut response = Response::new(body.boxed());
                *response.status_mut() = head.status;
                *response.headers_mut() = head.headers();
                response
            }
            Err(refusal) => refusal.response(),
        }
    }

    /// Counts a request received.
    pub(crate) fn count_request(&self) {
        Counters::bump(&self.inner.counters.requests);
    }

    /// The answer to a request that names no routable key: 400.
    pub(crate) fn unroutable(&self, error: &KeyError) -> Refusal {
        let reason = match error {
            KeyError::Missing => "no_key",
            KeyError::Invalid(_) => "bad_key",
        };
        self.refuse(StatusCode::BAD_REQUEST, reason, None, None)
    }

    /// The answer to a body refused with `status` (see [`BodyBuffer`]).
    pub(crate) fn refuse_body(&self, status: StatusCode, key: KeyRef<'_>) -> Refusal {
        let reason = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
            StatusCode::REQUEST_TIMEOUT => "body_timeout",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded",
            _ => "bad_body",
        };
        self.refuse(status, reason, Some(key), None)
    }

    /// Resolves `key` and forwards the request to its actor: on a failure
    /// to reach it, reports the answer unreachable and retries once on a
    /// fresh resolve (a request that may have reached the actor only if
    /// its method is idempotent). The response's body is read from the
    /// actor as it is polled.
    pub(crate) async fn deliver(
        &self,
        key: KeyRef<'_>,
        method: &Method,
        path_and_query: &str,
        headers: Headers<'_>,
        body: &Bytes,
    ) -> Result<(ResponseHead, PooledBody), Refusal> {
        for attempt in 1..=FORWARD_ATTEMPTS_MAX {
            let at = match self.resolve(key).await {
                Ok(at) => at,
                Err(e) => return Err(self.unresolved(key, &e)),
            };
            match self
                .forward(&at, method, path_and_query, headers, body)
                .await
            {
                Ok(response) => {
                    self.inner.metrics.forwarded();
                    return Ok(response);
                }
                Err(Forward::Unreachable { error, sent }) => {
                    debug!(%key, reservation = %at.reservation(), actor = at.actor(), %error, attempt, "actor unreachable");
                    self.inner.resolver.report_unreachable_ref(key, &at).await;
                    // A request that may have reached the actor is sent again
                    // only if doing it twice means doing it once.
                    if sent && !method.is_idempotent() {
                        break;
                    }
                    if attempt < FORWARD_ATTEMPTS_MAX {
                        Counters::bump(&self.inner.counters.retries);
                    }
                }
                Err(Forward::Timeout) => {
                    self.inner.resolver.report_unreachable_ref(key, &at).await;
                    return Err(self.refuse(
                        StatusCode::GATEWAY_TIMEOUT,
                        "upstream_timeout",
                        Some(key),
                        None,
                    ));
                }
                Err(Forward::NotAllowed) => {
                    Counters::bump(&self.inner.counters.actors_not_allowed);
                    return Err(self.refuse(
                        StatusCode::BAD_GATEWAY,
                        "actor_not_allowed",
                        Some(key),
                        None,
                    ));
                }
                Err(Forward::BadActor(actor)) => {
                    warn!(%key, reservation = %at.reservation(), %actor, "actor id is not host:port");
                    return Err(self.refuse(
                        StatusCode::BAD_GATEWAY,
                        "bad_actor_address",
                        Some(key),
                        None,
                    ));
                }
            }
        }
        Err(self.refuse(
            StatusCode::BAD_GATEWAY,
            "actor_unreachable",
            Some(key),
            None,
        ))
    }

    /// A body buffer bounded by this router's limits.
    pub(crate) fn body_buffer(&self) -> BodyBuffer<'_> {
        BodyBuffer {
            max: self.inner.config.request_body_bytes_max,
            bodies: &self.inner.bodies,
            first: Bytes::new(),
            rest: BytesMut::new(),
            len: 0,
            counted: None,
        }
    }

    /// How long a request body may take to arrive.
    pub(crate) fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.config.body_read_timeout_ms)
    }

    /// The router's configuration.
    pub(crate) fn config(&self) -> &EdgeConfig {
        &self.inner.config
    }

    /// Buffers the body (bounded in size, in time, and with every other
    /// body in bytes) so a failed forward can be retried; returns it with
    /// the permits that count its bytes.
    async fn read_body(
        &self,
        headers: &HeaderMap,
        body: Incoming,
    ) -> Result<(Bytes, Option<SemaphorePermit<'_>>), StatusCode> {
        // Most requests have none: nothing to collect.
        if body.is_end_stream() {
            return Ok((Bytes::new(), None));
        }
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let buffer = self.body_buffer();
        if let Some(len) = declared {
            buffer.declare(len)?;
        }
        tokio::time::timeout(self.body_read_timeout(), collect_body(buffer, body))
            .await
            .unwrap_or(Err(StatusCode::REQUEST_TIMEOUT))
    }

    /// Resolves `key`, waiting (boundedly) while its tail is vacant.
    async fn resolve(&self, key: KeyRef<'_>) -> Result<Resolved<'_>, ResolveError> {
        let resolver = &self.inner.resolver;
        let poll = Duration::from_millis(MOVE_POLL_MS);
        // Set at the first vacant answer: a hit reads no clock.
        let mut until = None;
        loop {
            let answer = if self.inner.config.stale_answers {
                resolver.resolve_ref_or_stale(key).await
            } else {
                resolver.resolve_ref(key).await
            };
            match answer {
                Ok(at) => {
                    let counters = &self.inner.counters;
                    Counters::bump(if at.from_cache() {
                        &counters.resolved_from_cache
                    } else {
                        &counters.resolved_by_walk
                    });
                    if at.stale() {
                        Counters::bump(&counters.resolved_stale);
                    }
                    return Ok(at);
                }
                Err(e @ ResolveError::Vacant { .. }) => {
                    let now = Instant::now();
                    let wait = Duration::from_millis(self.inner.config.move_wait_ms);
                    if now + poll >= *until.get_or_insert(now + wait) {
                        return Err(e);
                    }
                    tokio::time::sleep(poll).await;
                }
                Err(e) => {
                    if let ResolveError::Unavailable { suspect: true, .. } = e {
                        Counters::bump(&self.inner.counters.unavailable_suspect);
                    }
                    return Err(e);
                }
            }
        }
    }

    async fn forward(
        &self,
        at: &Resolved<'_>,
        method: &Method,
        path_and_query: &str,
        headers: Headers<'_>,
        body: &Bytes,
    ) -> Result<(ResponseHead, PooledBody), Forward> {
        // Tells the actor what the router resolved, so it can refuse
        // misrouted work; written straight into the request head.
        let dc = at.dc().as_str().as_bytes();
        let (mut unique, mut token) = ([0; DECIMAL_BYTES_MAX], [0; DECIMAL_BYTES_MAX]);
        let unique = decimal(at.reservation().unique(), &mut unique);
        let token = decimal(at.token().get(), &mut token);
        // As `ReservationId` and `FencingToken` display (tested).
        let extra: [Extra<'_>; 3] = [
            (&IDENTITY_HEADERS[0], &[dc]),
            (&IDENTITY_HEADERS[1], &[dc, b".", unique]),
            (&IDENTITY_HEADERS[2], &[token]),
        ];
        // Origin-form: the actor connection is the actor's own.
        let request = Outgoing {
            method,
            path_and_query,
            headers,
            extra: &extra,
            body,
        };
        let timeout = Duration::from_millis(self.inner.config.upstream_timeout_ms);
        let sent = async {
            let _permit = self.inner.forwards.acquire().await;
            let started = Instant::now();
            let answer = self.inner.pool.send(at.actor(), &request).await;
            if answer.is_ok() {
                self.inner.metrics.upstream(started.elapsed());
            }
            answer
        };
        match tokio::time::timeout(timeout, sent).await {
            Err(_) => Err(Forward::Timeout),
            Ok(Err(SendError::BadActor)) => Err(Forward::BadActor(at.actor().to_string())),
            Ok(Err(SendError::NotAllowed)) => Err(Forward::NotAllowed),
            Ok(Err(SendError::Connect(error))) => Err(Forward::Unreachable { error, sent: false }),
            Ok(Err(SendError::Broken { error, sent })) => Err(Forward::Unreachable { error, sent }),
            Ok(Ok(answer)) => Ok(answer),
        }
    }

    fn unresolved(&self, key: KeyRef<'_>, error: &ResolveError) -> Refusal {
        let (status, reason, dc) = unresolved_as(error);
        debug!(%key, %error, "not routed");
        self.refuse(status, reason, Some(key), dc)
    }

    /// The router's own answer: `{"error":reason,"key":…,"dc":…}`.
    fn refuse(
        &self,
        status: StatusCode,
        reason: &'static str,
        key: Option<KeyRef<'_>>,
        dc: Option<&str>,
    ) -> Refusal {
        Counters::bump(&self.inner.counters.failures);
        self.inner.metrics.refused(reason);
        let mut object = json::Object::new().string("error", reason);
        if let Some(key) = key {
            object = object.string("key", &key.to_string());
        }
        if let Some(dc) = dc {
            object = object.string("dc", dc);
        }
        Refusal {
            status,
            body: object.finish(),
        }
    }
}

/// How a key the Resolver could not answer is refused: the status, the
/// reason named in the body, and the DC it names, if any.
fn unresolved_as(error: &ResolveError) -> (StatusCode, &'static str, Option<&str>) {
    match error {
        ResolveError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found", None),
        ResolveError::Unavailable { dc, .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            Some(dc.as_str()),
        ),
        ResolveError::Vacant { .. } => (StatusCode::SERVICE_UNAVAILABLE, "vacant", None),
        ResolveError::ChainTooLong(_) => (StatusCode::BAD_GATEWAY, "chain_too_long", None),
        ResolveError::Inconsistent(_) => (StatusCode::BAD_GATEWAY, "inconsistent", None),
    }
}

/// The router's own answer to a request it did not forward (or whose
/// forward failed): a status and a short JSON body naming the reason.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    /// `{"error":reason,…}` and a newline.
    pub(crate) body: String,
}

impl Refusal {
    /// As a hyper response.
    fn response(self) -> Response<EdgeBody> {
        json_response(self.status, self.body)
    }
}

/// A request body being buffered, bounded in size (413), and with every
/// other body buffered at once in bytes (503): each piece is counted as it
/// arrives, and the count is held until the buffer's permits are dropped.
/// A body that arrives in one piece is kept as it came (no copy); one in
/// several is copied into one buffer as it arrives, so what is held stays
/// within twice the bytes counted however small the pieces (a chunked body
/// of one-byte chunks would otherwise hold a 32-byte handle per byte).
pub(crate) struct BodyBuffer<'r> {
    max: usize,
    bodies: &'r Semaphore,
    /// The body while it is one piece.
    first: Bytes,
    /// The body once it is more than one piece.
    rest: BytesMut,
    len: usize,
    counted: Option<SemaphorePermit<'r>>,
}

impl<'r> BodyBuffer<'r> {
    /// The length the request declared: larger than the bound is refused
    /// before a byte is read.
    pub(crate) fn declare(&self, len: u64) -> Result<(), StatusCode> {
        if len > self.max as u64 {
            return Err(StatusCode::PAYLOAD_TOO_LARGE);
        }
        Ok(())
    }

    /// Adds the next piece of the body.
    pub(crate) fn push(&mut self, data: Bytes) -> Result<(), StatusCode> {
        self.len += data.len();
        if self.len > self.max {
            return Err(StatusCode::PAYLOAD_TOO_LARGE);
        }
        // A piece of 4 GiB or more cannot be counted: refused as overload.
        let permits = u32::try_from(data.len()).map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
        let permit = self
            .bodies
            .try_acquire_many(permits)
            .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
        match &mut self.counted {
            Some(counted) => counted.merge(permit),
            None => self.counted = Some(permit),
        }
        if self.first.is_empty() && self.rest.is_empty() {
            self.first = data;
        } else {
            if self.rest.is_empty() {
                self.rest = BytesMut::from(&std::mem::take(&mut self.first)[..]);
            }
            self.rest.extend_from_slice(&data);
        }
        Ok(())
    }

    /// The whole body, and the permits that count its bytes.
    pub(crate) fn finish(self) -> (Bytes, Option<SemaphorePermit<'r>>) {
        let body = if self.rest.is_empty() {
            self.first
        } else {
            self.rest.freeze()
        };
        (body, self.counted)
    }
}

/// Reads a hyper request body into `buffer`.
async fn collect_body(
    mut buffer: BodyBuffer<'_>,
    mut body: Incoming,
) -> Result<(Bytes, Option<SemaphorePermit<'_>>), StatusCode> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| StatusCode::BAD_REQUEST)?;
        // Trailers are not forwarded.
        if let Ok(data) = frame.into_data() {
            buffer.push(data)?;
        }
    }
    Ok(buffer.finish())
}

/// A response with a JSON body.
pub(crate) fn json_response(status: StatusCode, text: String) -> Response<EdgeBody> {
    let mut response = Response::new(Full::new(Bytes::from(text)).map_err(|e| match e {}).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Removes the hop-by-hop headers ([`HOP_BY_HOP`] and those `Connection`
/// names) and `Host`, in place.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    headers.remove(header::HOST);
    let hop = |name: &HeaderName| HOP_BY_HOP.contains(&name.as_str());
    // Most messages have none: one pass to see, no work after it.
    if !headers.keys().any(hop) {
        return;
    }
    // Headers named in `Connection` are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in &named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_in_many_small_pieces_is_held_in_one_buffer_within_twice_its_size() {
        const PIECES: usize = 10_000;
        let bodies = Semaphore::new(1 << 20);
        let mut buffer = BodyBuffer {
            max: 1 << 20,
            bodies: &bodies,
            first: Bytes::new(),
            rest: BytesMut::new(),
            len: 0,
            counted: None,
        };
        for i in 0..PIECES {
            buffer
                .push(Bytes::from(vec![b'a' + (i % 26) as u8]))
                .unwrap();
            let held = buffer.first.len() + buffer.rest.capacity();
            assert!(held <= 2 * (i + 1) + 64, "{held} bytes held for {}", i + 1);
        }
        let (body, counted) = buffer.finish();
        assert_eq!(body.len(), PIECES);
        assert_eq!(&body[..3], b"abc");
        assert_eq!(counted.map(|c| c.num_permits()), Some(PIECES));
        assert_eq!(
            bodies.available_permits(),
            1 << 20,
            "released with the permits"
        );
    }

    /// EDGE-ROUTER.md's table of refusals, for every way a resolve fails
    /// (the e2e tests see not_found, unavailable and vacant through real
    /// DCs; a contradiction and an overlong chain need a lying DC).
    #[test]
    fn every_resolve_error_is_refused_with_the_documented_status_and_reason() {
        use homing_core::{DcId, Key, KeyName};
        let key = Key::new(KeyName::new("k").unwrap());
        let dc = DcId::new("iad").unwrap();
        let cases = [
            (ResolveError::NotFound(key.clone()), 404, "not_found", None),
            (
                ResolveError::Unavailable {
                    dc: dc.clone(),
                    reason: "timed out".into(),
                    suspect: false,
                },
                503,
                "unavailable",
                Some("iad"),
            ),
            (
                ResolveError::Vacant {
                    key,
                    reservation: "iad.1".parse().unwrap(),
                },
                503,
                "vacant",
                None,
            ),
            (ResolveError::ChainTooLong(64), 502, "chain_too_long", None),
            (
                ResolveError::Inconsistent("a cycle".into()),
                502,
                "inconsistent",
                None,
            ),
        ];
        for (error, status, reason, named) in cases {
            let (got_status, got_reason, got_dc) = unresolved_as(&error);
            assert_eq!(
                (got_status.as_u16(), got_reason, got_dc),
                (status, reason, named),
                "{error}"
            );
        }
    }

    #[test]
    fn a_body_in_one_piece_is_kept_as_it_came() {
        let bodies = Semaphore::new(1 << 20);
        let mut buffer = BodyBuffer {
            max: 4,
            bodies: &bodies,
            first: Bytes::new(),
            rest: BytesMut::new(),
            len: 0,
            counted: None,
        };
        let piece = Bytes::from_static(b"abcd");
        buffer.push(piece.clone()).unwrap();
        assert_eq!(
            buffer.push(Bytes::from_static(b"e")),
            Err(StatusCode::PAYLOAD_TOO_LARGE)
        );
        let (body, _) = buffer.finish();
        assert_eq!(body.as_ptr(), piece.as_ptr(), "not copied");
    }
}
