//! `Server`: accepts mutually authenticated QUIC connections, derives each
//! caller's identity from its certificate once per connection, and serves one
//! request per bidirectional stream: authorize, hand to the [`Handler`], reply.
//! Shutdown stops accepting, lets in-flight requests finish and their replies
//! be acknowledged (bounded by the drain time), then closes the endpoint.

use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use homing_core::wire;
use homing_core::{DcId, ErrorKind, ErrorReply, Identity, Reply, Request, authorize};
use quinn::crypto::rustls::QuicServerConfig;
use quinn::{
    Connection, ConnectionError, Endpoint, Incoming, RecvStream, SendStream, TransportErrorCode,
    VarInt,
};
use rustls::pki_types::CertificateDer;
use tokio::sync::{mpsc, watch};
use tokio::time::Sleep;
use tracing::{debug, warn};

use crate::admission::{Admission, CertFingerprint};
use crate::error::NetError;
use crate::frame::{
    self, CODE_BAD_IDENTITY, CODE_REFUSED, CODE_REQUEST_TIMEOUT, CODE_SHUTDOWN, ReadFrameError,
    RequestBudget,
};
use crate::identity::identity_from_cert;
use crate::limits::{FAILURE_SUMMARY_INTERVAL_MS, ServerLimits};
use crate::stats::{CloseKind, Counters, ServerStats};
use crate::tls::TlsIdentity;
use crate::unacked::Unacked;

/// TLS alert `no_application_protocol` (RFC 7301), carried as a QUIC crypto error.
const ALERT_NO_APPLICATION_PROTOCOL: u8 = 120;
/// How long `shutdown` waits for closing connections to be acknowledged, in milliseconds.
const CLOSE_WAIT_MS: u64 = 1_000;

/// Serves requests. The server has already checked the caller's role with
/// [`homing_core::authorize`]; the handler decides everything else.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Answers `request` from `caller`.
    async fn handle(&self, caller: &Identity, request: Request) -> Reply;
}

/// A running QUIC server.
pub struct Server {
    endpoint: Endpoint,
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    /// Every accept loop, connection and request task holds a clone; all are
    /// dropped once the last in-flight request has finished.
    drain: Option<mpsc::Sender<()>>,
    drained: mpsc::Receiver<()>,
    accepting: Option<tokio::task::JoinHandle<()>>,
    shutdown_drain_ms: u64,
    stats: ServerStats,
    /// What new connections' configurations are built with ([`Server::reload`]).
    limits: ServerLimits,
}

/// Reloads a running server's certificates ([`Server::reload`]). Once the
/// server shut down, a reload changes nothing.
#[derive(Clone)]
pub struct ServerReloader {
    endpoint: Endpoint,
    limits: ServerLimits,
    stopped: watch::Receiver<bool>,
}

impl ServerReloader {
    /// See [`Server::reload`].
    pub fn reload(&self, tls: &TlsIdentity) -> Result<(), NetError> {
        let config = server_config(tls, &self.limits)?;
        // A shut-down server accepts nothing: a reload must not reopen it.
        if !*self.stopped.borrow() {
            self.endpoint.set_server_config(Some(config));
        }
        Ok(())
    }
}

/// What every connection and request task shares.
struct Shared {
    local_dc: DcId,
    limits: ServerLimits,
    handler: Arc<dyn Handler>,
    admission: Arc<Admission>,
    counters: Arc<Counters>,
}

impl Server {
    /// Binds `addr` and starts accepting connections whose certificates chain
    /// to `tls`'s CA, serving requests to `local_dc` with `handler`.
    pub async fn bind(
        addr: SocketAddr,
        tls: &TlsIdentity,
        local_dc: DcId,
        limits: ServerLimits,
        handler: Arc<dyn Handler>,
    ) -> Result<Server, NetError> {
        limits.validate()?;
        let config = server_config(tls, &limits)?;
        let endpoint_config = endpoint_config(tls);
        let socket = std::net::UdpSocket::bind(addr)?;
        size_receive_buffer(&socket, limits.udp_receive_buffer_bytes);
        let runtime = quinn::default_runtime()
            .ok_or(NetError::Limits("no async runtime for the QUIC endpoint"))?;
        let endpoint = Endpoint::new(endpoint_config, Some(config), socket, runtime)?;
        let local_addr = endpoint.local_addr()?;
        let (stop, stop_rx) = watch::channel(false);
        let (drain, drained) = mpsc::channel(1);
        let shutdown_drain_ms = limits.shutdown_drain_ms;
        let kept_limits = limits.clone();
        let admission = Admission::new(limits.shares, local_dc.clone());
        let counters = Arc::new(Counters::default());
        let stats = ServerStats {
            counters: counters.clone(),
            admission: admission.clone(),
        };
        let shared = Arc::new(Shared {
            local_dc,
            limits,
            handler,
            admission,
            counters,
        });
        let accepting = tokio::spawn(accept_loop(
            endpoint.clone(),
            shared,
            stop_rx,
            drain.clone(),
        ));
        Ok(Server {
            endpoint,
            local_addr,
            stop,
            drain: Some(drain),
            drained,
            accepting: Some(accepting),
            shutdown_drain_ms,
            stats,
            limits: kept_limits,
        })
    }

    /// Presents `tls`'s certificate and trusts its CA and revocation lists
    /// from now on: connections accepted after this use them, those open
    /// now go on as they are (a revoked peer's open connection is not cut;
    /// its next one is refused). The stateless-reset keys stay those of the
    /// key the server started with.
    pub fn reload(&self, tls: &TlsIdentity) -> Result<(), NetError> {
        self.reloader().reload(tls)
    }

    /// [`Server::reload`] for another task to call.
    pub fn reloader(&self) -> ServerReloader {
        ServerReloader {
            endpoint: self.endpoint.clone(),
            limits: self.limits.clone(),
            stopped: self.stop.subscribe(),
        }
    }

    /// The bound address (useful after binding port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// How many connections are open now, in any state (for tests).
    pub fn open_connections(&self) -> usize {
        self.endpoint.open_connections()
    }

    /// The server's connection counters (open by role, handshakes,
    /// refusals, closes), readable for as long as the handle is kept.
    pub fn stats(&self) -> ServerStats {
        self.stats.clone()
    }

    /// Stops accepting connections and streams, waits up to the limits'
    /// `shutdown_drain_ms` for in-flight requests to be answered, then closes
    /// the endpoint. Returns whether every in-flight request finished in time.
    pub async fn shutdown(mut self) -> bool {
        self.endpoint.set_server_config(None);
        let _ = self.stop.send(true);
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.await;
        }
        self.drain = None;
        let drain_time = Duration::from_millis(self.shutdown_drain_ms);
        // `recv` yields `None` once every task's sender is dropped.
        let drained = tokio::time::timeout(drain_time, self.drained.recv())
            .await
            .is_ok();
        if !drained {
            warn!(
                drain_ms = self.shutdown_drain_ms,
                "shutdown: in-flight requests still running, closing anyway"
            );
        }
        self.endpoint.close(CODE_SHUTDOWN, b"shutdown");
        let _ = tokio::time::timeout(
            Duration::from_millis(CLOSE_WAIT_MS),
            self.endpoint.wait_idle(),
        )
        .await;
        drained
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.endpoint.close(CODE_SHUTDOWN, b"shutdown");
    }
}

/// Asks for a receive buffer of `bytes` on the server's UDP socket, so a
/// burst of datagrams (a flood of Initials, many callers at once) waits in
/// the kernel instead of being dropped; says so when the kernel caps it
/// (`net.core.rmem_max` on Linux, see OPERATIONS.md).
fn size_receive_buffer(socket: &std::net::UdpSocket, bytes: usize) {
    if bytes == 0 {
        return;
    }
    let socket = socket2::SockRef::from(socket);
    let granted = socket
        .set_recv_buffer_size(bytes)
        .and_then(|()| socket.recv_buffer_size());
    // Linux reports twice the buffer it set (half of it is bookkeeping):
    // what datagrams may use is half the figure reported.
    let usable = |reported: usize| {
        if cfg!(target_os = "linux") {
            reported / 2
        } else {
            reported
        }
    };
    match granted.map(usable) {
        Ok(usable) if usable >= bytes => {
            debug!(
                udp_receive_buffer_bytes = usable,
                "udp receive buffer sized"
            );
        }
        Ok(usable) => warn!(
            asked_bytes = bytes,
            usable_bytes = usable,
            "udp receive buffer capped by the system: raise net.core.rmem_max (see OPERATIONS.md)"
        ),
        Err(error) => warn!(%error, "udp receive buffer could not be sized"),
    }
}

/// The endpoint's stateless-reset key and connection-ID generator, both
/// derived from the server's identity, so that a restarted process (same
/// identity, same address) recognises the connection IDs of its predecessor
/// and answers their packets with resets the peers accept: a peer's
/// connection to the dead process, and any request parked on it, ends within
/// one client keep-alive instead of at the idle timeout.
fn endpoint_config(tls: &TlsIdentity) -> quinn::EndpointConfig {
    let (reset_key, cid_key) = tls.endpoint_keys();
    let mut config = quinn::EndpointConfig::new(Arc::new(reset_key));
    config.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    config
}

fn server_config(
    tls: &TlsIdentity,
    limits: &ServerLimits,
) -> Result<quinn::ServerConfig, NetError> {
    let crypto = QuicServerConfig::try_from(tls.rustls_server_config()?)
        .map_err(|e| NetError::Tls(e.to_string()))?;
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(VarInt::from_u32(limits.streams_max))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .max_idle_timeout(Some(idle_timeout(limits.idle_timeout_ms)?))
        .keep_alive_interval(Some(Duration::from_millis(limits.keep_alive_interval_ms)))
        // Flow control bounds what a peer can make us buffer: one frame per
        // stream, and a fixed window per connection.
        .stream_receive_window(VarInt::from_u32(stream_window(limits.frame_bytes_max)))
        .receive_window(VarInt::from_u32(limits.connection_receive_bytes_max));
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// The per-stream receive window: one frame plus one byte, so an oversized
/// frame is detected by `read_to_end` rather than stalled by flow control.
pub(crate) fn stream_window(frame_bytes_max: usize) -> u32 {
    u32::try_from(frame_bytes_max.saturating_add(1)).unwrap_or(u32::MAX)
}

pub(crate) fn idle_timeout(idle_timeout_ms: u64) -> Result<quinn::IdleTimeout, NetError> {
    quinn::IdleTimeout::try_from(Duration::from_millis(idle_timeout_ms))
        .map_err(|_| NetError::Limits("idle_timeout_ms is too large for QUIC"))
}

async fn accept_loop(
    endpoint: Endpoint,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    drain: mpsc::Sender<()>,
) {
    let interval = Duration::from_millis(FAILURE_SUMMARY_INTERVAL_MS);
    let mut summary = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    summary.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let incoming = tokio::select! {
            _ = stop.changed() => break,
            _ = summary.tick() => {
                shared.counters.log_summary(FAILURE_SUMMARY_INTERVAL_MS);
                continue;
            }
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => incoming,
                None => break,
            },
        };
        if let Some(incoming) = admit_handshake(incoming, &shared) {
            shared.counters.handshake_started();
            tokio::spawn(serve_connection(
                incoming,
                shared.clone(),
                stop.clone(),
                drain.clone(),
            ));
        }
    }
}

/// Whether a new handshake may start (see [`handshake_admission`]); a
/// caller to retry is sent a QUIC Retry, one to refuse a refusal.
fn admit_handshake(incoming: Incoming, shared: &Shared) -> Option<Incoming> {
    let counters = &shared.counters;
    let handshakes_max = shared.limits.handshakes_max;
    let admission = handshake_admission(
        counters.handshakes_in_progress(),
        handshakes_max,
        incoming.remote_address_validated(),
        incoming.may_retry(),
    );
    match admission {
        HandshakeAdmission::Start => Some(incoming),
        HandshakeAdmission::Retry => {
            counters.retried();
            // Only fails when the Initial carried a token already (then
            // `may_retry` was false).
            let _ = incoming.retry();
            None
        }
        HandshakeAdmission::Refuse => {
            let remote = incoming.remote_address();
            if counters.refused(UNAUTHENTICATED, "handshakes_full") {
                warn!(%remote, handshakes_max, "refusing connection: too many handshakes in progress");
            }
            incoming.refuse();
            None
        }
    }
}

/// What to do with a new handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HandshakeAdmission {
    /// Start it.
    Start,
    /// Ask the caller to prove its address first (a stateless QUIC Retry).
    Retry,
    /// Refuse it.
    Refuse,
}

/// Handshakes hold no connection slot (that is taken once the certificate
/// is known) but are bounded on their own: past half of `handshakes_max`
/// in progress, a caller must first prove it can receive at its address (a
/// stateless QUIC Retry, which forged Initials never answer); past all of
/// it, even proven callers are refused. A caller that cannot be sent a
/// Retry (it answered one already, so it is validated) is only refused at
/// the full cap.
fn handshake_admission(
    in_progress: usize,
    handshakes_max: usize,
    validated: bool,
    may_retry: bool,
) -> HandshakeAdmission {
    if in_progress >= handshakes_max {
        HandshakeAdmission::Refuse
    } else if in_progress >= handshakes_max / 2 && !validated {
        if may_retry {
            HandshakeAdmission::Retry
        } else {
            HandshakeAdmission::Refuse
        }
    } else {
        HandshakeAdmission::Start
    }
}

/// The role label of refusals before the caller is known.
const UNAUTHENTICATED: &str = "unauthenticated";

/// Ends the handshake count when the handshake ends, however it ends.
struct Handshaking<'a>(&'a Counters);

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        self.0.handshake_ended();
    }
}

/// The finished handshake of `incoming`, within the handshake timeout.
async fn handshake(incoming: Incoming, shared: &Shared) -> Option<Connection> {
    let counters = &shared.counters;
    let _handshaking = Handshaking(counters);
    let remote = incoming.remote_address();
    let connecting = match incoming.accept() {
        Ok(connecting) => connecting,
        Err(error) => {
            log_handshake_failure(counters, remote, &error);
            return None;
        }
    };
    let timeout_ms = shared.limits.handshake_timeout_ms;
    // Dropping an unfinished `Connecting` abandons the handshake.
    match tokio::time::timeout(Duration::from_millis(timeout_ms), connecting).await {
        Ok(Ok(connection)) => Some(connection),
        Ok(Err(error)) => {
            log_handshake_failure(counters, remote, &error);
            None
        }
        Err(_) => {
            if counters.handshake_failed("timeout") {
                warn!(%remote, timeout_ms, "handshake abandoned: not finished in time");
            }
            None
        }
    }
}

async fn serve_connection(
    incoming: Incoming,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    drain: mpsc::Sender<()>,
) {
    let remote = incoming.remote_address();
    // A shutdown abandons handshakes: only requests are drained.
    let connection = tokio::select! {
        connection = handshake(incoming, &shared) => connection,
        _ = stop.wait_for(|stopped| *stopped) => None,
    };
    let Some(connection) = connection else {
        return;
    };
    let counters = &shared.counters;
    let (caller, cert) = match peer_certificate(&connection) {
        Ok((identity, cert)) => (Arc::new(identity), cert),
        Err(error) => {
            if counters.refused(UNAUTHENTICATED, "no_identity") {
                warn!(%remote, %error, "closing connection: certificate names no homing identity");
            }
            connection.close(CODE_BAD_IDENTITY, b"certificate names no homing identity");
            return;
        }
    };
    // The slot is held until every reply on the connection is acknowledged.
    let _slot = match shared.admission.admit(&caller, cert) {
        Ok(slot) => slot,
        Err(refusal) => {
            let role = caller.role().as_str();
            if counters.refused(role, refusal.as_str()) {
                warn!(%remote, caller = %caller, %refusal, "refusing connection");
            } else {
                debug!(%remote, caller = %caller, %refusal, "refusing connection");
            }
            let reason = format!("connection refused to {role}: {refusal}");
            connection.close(CODE_REFUSED, reason.as_bytes());
            return;
        }
    };
    let version = match connection_version(&connection) {
        Ok(version) => version,
        Err(error) => {
            warn!(%remote, caller = %caller, %error, "closing connection: no protocol version agreed");
            connection.close(CODE_BAD_IDENTITY, b"no protocol version agreed");
            return;
        }
    };
    debug!(%remote, caller = %caller, version, "connection established");
    if *stop.borrow_and_update() {
        counters.closed(CloseKind::Local);
        return;
    }
    let unacked = Arc::new(Unacked::new());
    let budget = Arc::new(RequestBudget::new(
        shared.limits.connection_receive_bytes_max,
        counters.clone(),
    ));
    // One future for the whole connection, not one per stream.
    let mut stopped = pin!(stop.changed());
    loop {
        let (send, recv) = tokio::select! {
            _ = &mut stopped => {
                counters.closed(CloseKind::Local);
                break;
            }
            stream = connection.accept_bi() => match stream {
                Ok(stream) => stream,
                Err(error) => {
                    debug!(%remote, %error, "connection ended");
                    counters.closed(CloseKind::of(&error));
                    break;
                }
            },
        };
        tokio::spawn(serve_request(
            send,
            recv,
            caller.clone(),
            version,
            unacked.clone(),
            budget.clone(),
            shared.clone(),
            drain.clone(),
        ));
    }
    // Let the connection go only once every reply on it is acknowledged
    // (an ended connection has nothing left to wait for).
    unacked.drain().await;
}

fn log_handshake_failure(counters: &Counters, remote: SocketAddr, error: &ConnectionError) {
    let alpn_mismatch = matches!(error, ConnectionError::TransportError(e)
        if e.code == TransportErrorCode::crypto(ALERT_NO_APPLICATION_PROTOCOL));
    if alpn_mismatch {
        if counters.handshake_failed("version_mismatch") {
            warn!(%remote, oldest = wire::PROTOCOL_VERSION_OLDEST, newest = wire::PROTOCOL_VERSION,
                "handshake refused: protocol version mismatch (peer offered no alpn of a version spoken here)");
        }
    } else if counters.handshake_failed("tls") {
        warn!(%remote, %error, "handshake failed");
    } else {
        debug!(%remote, %error, "handshake failed");
    }
}

/// The protocol version the handshake of `connection` settled on.
pub(crate) fn connection_version(connection: &Connection) -> Result<u16, NetError> {
    let protocol = connection
        .handshake_data()
        .and_then(|any| any.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|data| data.protocol);
    let protocol = protocol.ok_or_else(|| NetError::Tls("no alpn agreed".to_string()))?;
    wire::version_of_alpn(&protocol).ok_or_else(|| {
        let alpn = String::from_utf8_lossy(&protocol);
        NetError::Tls(format!("alpn {alpn:?} names no homing protocol version"))
    })
}

/// The peer's identity from its verified certificate.
pub(crate) fn peer_identity(connection: &Connection) -> Result<Identity, NetError> {
    Ok(peer_certificate(connection)?.0)
}

/// The peer's identity and the fingerprint of its verified certificate.
fn peer_certificate(connection: &Connection) -> Result<(Identity, CertFingerprint), NetError> {
    let certs = connection
        .peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
        .ok_or_else(|| NetError::Tls("peer presented no certificate".to_string()))?;
    let leaf = certs
        .first()
        .ok_or_else(|| NetError::Tls("peer presented an empty chain".to_string()))?;
    Ok((identity_from_cert(leaf)?, CertFingerprint::of(leaf)))
}

#[allow(clippy::too_many_arguments)] // the streams, the connection's caller and version, and what they share
async fn serve_request(
    mut send: SendStream,
    mut recv: RecvStream,
    caller: Arc<Identity>,
    version: u16,
    unacked: Arc<Unacked>,
    budget: Arc<RequestBudget>,
    shared: Arc<Shared>,
    _drain: mpsc::Sender<()>,
) {
    let limits = &shared.limits;
    // One deadline for reading, answering and writing: a timer is registered
    // only if some step has to wait, and at most once per request.
    let deadline = tokio::time::sleep(Duration::from_millis(limits.request_timeout_ms));
    tokio::pin!(deadline);
    let read = within(
        deadline.as_mut(),
        budget.read_frame(&mut recv, limits.frame_bytes_max),
    )
    .await;
    // The frame's bytes (and their budget) go as soon as it is decoded: a
    // request may be parked for minutes.
    let read = read.map(|read| read.map(|frame| decode(version, frame.bytes(), &caller)));
    let reply = match read {
        None => {
            debug!(caller = %caller, timeout_ms = limits.request_timeout_ms, "request not received in time");
            let _ = send.reset(CODE_REQUEST_TIMEOUT);
            let _ = recv.stop(CODE_REQUEST_TIMEOUT);
            return;
        }
        Some(Ok(decoded)) => match decoded {
            Ok(request) => {
                // A request that asks to wait gets that much more time.
                let parked = Duration::from_millis(u64::from(request.wait_ms()));
                if !parked.is_zero() {
                    let extended = deadline.deadline() + parked;
                    deadline.as_mut().reset(extended);
                }
                match within(deadline.as_mut(), answer(request, &caller, &shared)).await {
                    Some(reply) => reply,
                    None => {
                        debug!(caller = %caller, "request timed out");
                        let _ = send.reset(CODE_REQUEST_TIMEOUT);
                        return;
                    }
                }
            }
            Err(error) => Reply::Error(error),
        },
        Some(Err(ReadFrameError::TooLarge)) => {
            debug!(caller = %caller, frame_bytes_max = limits.frame_bytes_max, "request frame too large");
            Reply::Error(ErrorReply::new(
                ErrorKind::BadRequest,
                format!("request frame exceeds {} bytes", limits.frame_bytes_max),
            ))
        }
        Some(Err(ReadFrameError::OverBudget { budget_bytes })) => {
            debug!(caller = %caller, budget_bytes, "request refused: the connection's request budget is spent");
            Reply::Error(ErrorReply::new(
                ErrorKind::Overloaded,
                format!(
                    "this connection's partly received requests already hold {budget_bytes} bytes"
                ),
            ))
        }
        Some(Err(ReadFrameError::Closed(reason))) => {
            debug!(caller = %caller, %reason, "request stream closed before the frame ended");
            return;
        }
    };
    match within(
        deadline.as_mut(),
        deliver(&mut send, version, &reply, &caller),
    )
    .await
    {
        None => {
            debug!(caller = %caller, "reply not written in time");
            let _ = send.reset(CODE_REQUEST_TIMEOUT);
        }
        // Shutdown's drain covers delivery, not just handling: the
        // connection keeps the written reply until it is acknowledged, or,
        // once the connection drains, this task waits for it (no timer:
        // quinn counts a stream against the caller's stream limit until its
        // reply is acknowledged, and shutdown bounds the wait by its drain time).
        Some(true) => {
            if let Some(send) = unacked.keep(send) {
                let _ = send.stopped().await;
            }
        }
        Some(false) => {}
    }
}

/// `work`'s output, or `None` if `deadline` passes first. `work` is polled
/// first, so work that is ready at once never registers the timer.
async fn within<F: Future>(mut deadline: Pin<&mut Sleep>, work: F) -> Option<F::Output> {
    let mut work = pin!(work);
    poll_fn(|cx| {
        if let Poll::Ready(output) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        deadline.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// Writes the reply and finishes the stream; whether it was written. A
/// reply the connection's `version` does not carry is answered `Internal`
/// (a handler answered a request with a reply newer than the request).
async fn deliver(send: &mut SendStream, version: u16, reply: &Reply, caller: &Identity) -> bool {
    let encoded = wire::check_version(reply, version)
        .map_err(|e| e.to_string())
        .and_then(|()| wire::encode(reply).map_err(|e| e.to_string()));
    let bytes = match encoded {
        Ok(bytes) => bytes,
        Err(error) => {
            warn!(caller = %caller, %error, "reply could not be encoded");
            let internal = Reply::Error(ErrorReply::new(
                ErrorKind::Internal,
                "reply could not be encoded",
            ));
            // Unwrap: a short error reply always fits in a frame.
            wire::encode(&internal).expect("error reply fits a frame")
        }
    };
    if let Err(reason) = frame::write_frame(send, &bytes).await {
        debug!(caller = %caller, %reason, "reply not sent");
        return false;
    }
    true
}

/// Decodes a request frame that arrived on a connection of protocol
/// `version`, or the error to answer a malformed one with.
fn decode(version: u16, bytes: &[u8], caller: &Identity) -> Result<Request, ErrorReply> {
    wire::decode_for::<Request>(version, bytes).map_err(|error| {
        debug!(caller = %caller, %error, "malformed request");
        ErrorReply::new(ErrorKind::BadRequest, error.to_string())
    })
}

async fn answer(request: Request, caller: &Identity, shared: &Shared) -> Reply {
    if let Err(denied) = authorize(caller, &request, &shared.local_dc) {
        debug!(caller = %caller, request = request.kind(), "request denied");
        return Reply::Error(ErrorReply::new(ErrorKind::Unauthorized, denied.to_string()));
    }
    shared.handler.handle(caller, request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshakes_start_up_to_half_the_cap_then_need_a_retry_then_are_refused() {
        use HandshakeAdmission::{Refuse, Retry, Start};
        const MAX: usize = 8;
        for in_progress in 0..MAX / 2 {
            assert_eq!(handshake_admission(in_progress, MAX, false, true), Start);
        }
        for in_progress in MAX / 2..MAX {
            assert_eq!(
                handshake_admission(in_progress, MAX, false, true),
                Retry,
                "unproven, past half"
            );
            assert_eq!(
                handshake_admission(in_progress, MAX, true, false),
                Start,
                "proven, under the cap"
            );
            assert_eq!(
                handshake_admission(in_progress, MAX, false, false),
                Refuse,
                "unproven and cannot be retried"
            );
        }
        for in_progress in [MAX, MAX + 1] {
            assert_eq!(
                handshake_admission(in_progress, MAX, true, false),
                Refuse,
                "at the cap"
            );
            assert_eq!(
                handshake_admission(in_progress, MAX, false, true),
                Refuse,
                "at the cap"
            );
        }
    }
}
