//! `EdgeConfig`: how the edge router finds the key in a request and the
//! bounds it keeps on bodies, upstream waits and connections to actors, and
//! the networks it forwards to. `ServeLimits`: the bounds of a listening
//! side, the router's (`EdgeConfig::serve`) or the actor host's, on the
//! connections it accepts.

use homing_core::Namespace;
use hyper::header::HeaderName;

use crate::network::ActorNetwork;

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

/// Default most connections served at once; at the cap a new connection
/// takes the place of the oldest one that has not sent a request yet, or is
/// closed on accept if there is none ([`crate::admission`]).
pub const CONNECTIONS_MAX_DEFAULT: usize = 10_000;
/// Default time a new connection has to show its protocol (the HTTP/2
/// preface, or bytes that cannot start it), in milliseconds.
pub const DETECT_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Default time an HTTP/1 client has to send a request's headers, counted
/// from the end of the previous response, in milliseconds.
pub const HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default time a connection may stay open with no request in flight, in milliseconds.
pub const IDLE_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Default most concurrent streams of one HTTP/2 connection.
pub const H2_STREAMS_MAX_DEFAULT: u32 = 100;
/// Default HTTP/2 stream flow-control window, in bytes.
pub const H2_STREAM_WINDOW_BYTES_DEFAULT: u32 = 256 * 1024;
/// Default HTTP/2 connection flow-control window, in bytes.
pub const H2_CONNECTION_WINDOW_BYTES_DEFAULT: u32 = 1024 * 1024;
/// Default largest HTTP/2 header list (decoded, RFC 9113 §6.5.2), in bytes.
pub const H2_HEADER_LIST_BYTES_MAX_DEFAULT: u32 = 16 * 1024;
/// Default most response bytes queued per HTTP/2 stream toward a slow client, in bytes.
pub const H2_SEND_BUFFER_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// Default time a write to a client may make no progress (the client
/// stopped reading) before the connection is dropped, in milliseconds.
pub const WRITE_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Time a connection shut down for idleness has to finish closing (an HTTP/2
/// client acknowledging the GOAWAY's ping) before it is dropped, in milliseconds.
pub const IDLE_CLOSE_GRACE_MS: u64 = 1_000;

/// Bounds of a listening side. What one HTTP/2 connection can make the
/// server hold is bounded by these (EDGE-ROUTER.md works it out).
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Most connections served at once. At the cap a new connection takes
    /// the place of the oldest one that has not sent a request yet (closed,
    /// unanswered); if every one has, the new one is closed on accept.
    pub connections_max: usize,
    /// Time a new connection has to show its protocol, in milliseconds; a
    /// silent connection is closed after it.
    pub detect_timeout_ms: u64,
    /// Time an HTTP/1 client has to send a request's headers, in
    /// milliseconds, counted from the end of the previous response: also
    /// the longest an HTTP/1 connection waits idle between requests.
    pub header_read_timeout_ms: u64,
    /// Time a connection (HTTP/1 or HTTP/2) may stay open with no request in
    /// flight, in milliseconds; then it is shut down gracefully (HTTP/2:
    /// GOAWAY) and dropped if not closed within [`IDLE_CLOSE_GRACE_MS`].
    pub idle_timeout_ms: u64,
    /// Time a write to the client may make no progress, in milliseconds:
    /// a client that stops reading its response has its connection dropped
    /// (with every stream on it, for HTTP/2) after it.
    pub write_timeout_ms: u64,
    /// Most concurrent streams of one HTTP/2 connection.
    pub h2_streams_max: u32,
    /// HTTP/2 stream flow-control window: request body bytes one stream may
    /// have sent and the server not yet read, in bytes.
    pub h2_stream_window_bytes: u32,
    /// HTTP/2 connection flow-control window: the same over all streams of
    /// the connection, in bytes.
    pub h2_connection_window_bytes: u32,
    /// Largest HTTP/2 header list a request may carry, in bytes.
    pub h2_header_list_bytes_max: u32,
    /// Most response bytes queued per HTTP/2 stream toward the client, in bytes.
    pub h2_send_buffer_bytes_max: usize,
}

impl Default for ServeLimits {
    fn default() -> ServeLimits {
        ServeLimits {
            connections_max: CONNECTIONS_MAX_DEFAULT,
            detect_timeout_ms: DETECT_TIMEOUT_MS_DEFAULT,
            header_read_timeout_ms: HEADER_READ_TIMEOUT_MS_DEFAULT,
            idle_timeout_ms: IDLE_TIMEOUT_MS_DEFAULT,
            write_timeout_ms: WRITE_TIMEOUT_MS_DEFAULT,
            h2_streams_max: H2_STREAMS_MAX_DEFAULT,
            h2_stream_window_bytes: H2_STREAM_WINDOW_BYTES_DEFAULT,
            h2_connection_window_bytes: H2_CONNECTION_WINDOW_BYTES_DEFAULT,
            h2_header_list_bytes_max: H2_HEADER_LIST_BYTES_MAX_DEFAULT,
            h2_send_buffer_bytes_max: H2_SEND_BUFFER_BYTES_MAX_DEFAULT,
        }
    }
}
