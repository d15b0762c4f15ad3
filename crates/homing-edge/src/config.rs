//! `EdgeConfig`: how the edge router finds the key in a request and the
//! bounds it keeps on bodies, upstream waits and connections to actors, and
//! the networks it forwards to.

use homing_core::Namespace;
use hyper::header::HeaderName;

use crate::network::ActorNetwork;
use crate::serve::ServeLimits;

/// Default header carrying the key name.
pub const KEY_HEADER_DEFAULT: &str = "x-homing-key";
/// Default largest request body forwarded, in bytes (the body is buffered
/// so that a failed forward can be retried once).
pub const REQUEST_BODY_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
/// Default most request body bytes buffered at once over all requests, in
/// bytes: a body that would exceed it is answered 503 `overloaded`.
pub const REQUEST_BODIES_BYTES_MAX_DEFAULT: usize = 64 * 1024 * 1024;
/// Default time a request's whole body has to arrive, in milliseconds: a
/// body that trickles longer is answered 408.
pub const BODY_READ_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Default wait for an actor's response headers, in milliseconds.
pub const UPSTREAM_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default timeout of one TCP connect to an actor, in milliseconds.
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// Default most actors the connection pool keeps (their address and parked
/// connections); past it, actors not in use are evicted.
pub const POOL_ACTORS_MAX_DEFAULT: usize = 16_384;
/// Default idle connections kept per actor.
pub const POOL_IDLE_PER_ACTOR_MAX_DEFAULT: usize = 64;
/// Default time an idle actor connection is kept, in milliseconds.
pub const POOL_IDLE_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Default most forwards in flight at once, over all actors.
pub const FORWARDS_IN_FLIGHT_MAX_DEFAULT: usize = 4_096;
/// Default time a request waits for a key whose actor is moving (the tail is
/// vacant) before it is answered 503, in milliseconds.
pub const MOVE_WAIT_MS_DEFAULT: u64 = 2_000;
/// Interval between resolves while a key's tail is vacant, in milliseconds.
pub const MOVE_POLL_MS: u64 = 10;

/// How an [`EdgeRouter`](crate::EdgeRouter) routes. `Default` gives the
/// documented defaults: key from `x-homing-key` or `/k/<key>/`, default
/// namespace, fresh answers only.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// Header whose value is the key name; it wins over the path prefix.
    pub key_header: HeaderName,
    /// Whether `/k/<key>/rest` routes `<key>` and forwards `/rest`.
    pub path_prefix: bool,
    /// Namespace of every key this router routes.
    pub namespace: Namespace,
    /// Largest request body, in bytes; larger requests get 413.
    pub request_body_bytes_max: usize,
    /// Most request body bytes buffered at once over all requests and
    /// connections; a body that would exceed it gets 503.
    pub request_bodies_bytes_max: usize,
    /// Time the whole request body has to arrive, in milliseconds (from the
    /// end of the request's headers); then 408.
    pub body_read_timeout_ms: u64,
    /// Wait for an actor's response headers, in milliseconds; then 504.
    pub upstream_timeout_ms: u64,
    /// Timeout of one TCP connect to an actor, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Most actors the connection pool keeps; past it, actors not in use are
    /// evicted (their parked connections closed).
    pub pool_actors_max: usize,
    /// Idle connections kept per actor.
    pub pool_idle_per_actor_max: usize,
    /// Time an idle actor connection is kept, in milliseconds.
    pub pool_idle_timeout_ms: u64,
    /// Most forwards in flight at once; more wait (within the upstream timeout).
    pub forwards_in_flight_max: usize,
    /// How long a request waits while the key's tail is vacant (an actor
    /// moving between DCs) before 503; 0 answers 503 at once.
    pub move_wait_ms: u64,
    /// Serve a remembered answer, marked stale, when a DC is unavailable
    /// ([`Resolver::resolve_or_stale`](homing_client::Resolver::resolve_or_stale)).
    pub stale_answers: bool,
    /// Networks actor addresses must lie in to be forwarded to; any other
    /// is answered 502 `actor_not_allowed`. Default: loopback only
    /// ([`ACTOR_NETWORKS_DEFAULT`](crate::network::ACTOR_NETWORKS_DEFAULT)).
    pub actor_networks: Vec<ActorNetwork>,
    /// Bounds of the listening side.
    pub serve: ServeLimits,
}

impl Default for EdgeConfig {
    fn default() -> EdgeConfig {
        EdgeConfig {
            key_header: HeaderName::from_static(KEY_HEADER_DEFAULT),
            path_prefix: true,
            namespace: Namespace::default(),
            request_body_bytes_max: REQUEST_BODY_BYTES_MAX_DEFAULT,
            request_bodies_bytes_max: REQUEST_BODIES_BYTES_MAX_DEFAULT,
            body_read_timeout_ms: BODY_READ_TIMEOUT_MS_DEFAULT,
            upstream_timeout_ms: UPSTREAM_TIMEOUT_MS_DEFAULT,
            connect_timeout_ms: CONNECT_TIMEOUT_MS_DEFAULT,
            pool_actors_max: POOL_ACTORS_MAX_DEFAULT,
            pool_idle_per_actor_max: POOL_IDLE_PER_ACTOR_MAX_DEFAULT,
            pool_idle_timeout_ms: POOL_IDLE_TIMEOUT_MS_DEFAULT,
            forwards_in_flight_max: FORWARDS_IN_FLIGHT_MAX_DEFAULT,
            move_wait_ms: MOVE_WAIT_MS_DEFAULT,
            stale_answers: false,
            actor_networks: ActorNetwork::defaults(),
            serve: ServeLimits::default(),
        }
    }
}
