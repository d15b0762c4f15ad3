//! `Client`: sends one request per bidirectional stream over the pooled
//! connection to a peer and waits, bounded by the request timeout, for the
//! reply. Cheap to clone; clones share the endpoint and the pool. A program
//! about to exit calls [`Client::close`], so that servers free its
//! connections at once instead of keeping them until their idle timeout.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use homing_core::wire;
use homing_core::{Reply, Request, Role};
use quinn::crypto::rustls::QuicClientConfig;
use quinn::{Connection, ConnectionError, Endpoint, VarInt};
use tracing::debug;

use crate::error::NetError;
use crate::frame::{self, CODE_BAD_IDENTITY, CODE_CLIENT_CLOSED, CODE_REFUSED, ReadFrameError};
use crate::identity::node_server_name;
use crate::limits::{CLIENT_CLOSE_WAIT_MS, ClientLimits};
use crate::pool::{Peer, Pool, Pooled};
use crate::server::{connection_version, idle_timeout, peer_identity, stream_window};
use crate::tls::TlsIdentity;

/// How often [`Client::close`] looks whether its closes were sent.
const CLOSE_POLL: Duration = Duration::from_millis(1);

/// Datagrams `connection` has handed to the socket so far.
fn sent_datagrams(connection: &Connection) -> u64 {
    connection.stats().udp_tx.datagrams
}

/// A client of homing servers, with one pooled connection per peer.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    /// New connections' configuration ([`Client::reload`] replaces it).
    config: std::sync::RwLock<quinn::ClientConfig>,
    transport: Arc<quinn::TransportConfig>,
    limits: ClientLimits,
    pool: Pool,
    /// Set by [`Client::close`].
    closed: AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Relaxed) && self.endpoint.open_connections() > 0 {
            // Nothing waits for this close to be sent: in a program that
            // exits now, servers keep the connections until their idle timeout.
            debug!(
                connections = self.endpoint.open_connections(),
                "client dropped without close(): its servers may keep its connections until they time out"
            );
        }
        self.endpoint.close(CODE_CLIENT_CLOSED, b"client dropped");
    }
}

impl Client {
    /// A client on an ephemeral IPv4 UDP port, presenting `tls`'s
    /// certificate. Must be called within a tokio runtime.
    pub fn new(tls: &TlsIdentity, limits: ClientLimits) -> Result<Client, NetError> {
        Client::bind(tls, limits, SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))
    }

    /// A client on the UDP address `addr` (e.g. `[::]:0` for IPv6 peers).
    /// Must be called within a tokio runtime.
    pub fn bind(
        tls: &TlsIdentity,
        limits: ClientLimits,
        addr: SocketAddr,
    ) -> Result<Client, NetError> {
        limits.validate()?;
        let mut transport = quinn::TransportConfig::default();
        transport
            .max_concurrent_bidi_streams(VarInt::from_u32(0))
            .max_concurrent_uni_streams(VarInt::from_u32(0))
            .max_idle_timeout(Some(idle_timeout(limits.idle_timeout_ms)?))
            .keep_alive_interval(Some(Duration::from_millis(limits.keep_alive_interval_ms)))
            .stream_receive_window(VarInt::from_u32(stream_window(limits.frame_bytes_max)));
        let transport = Arc::new(transport);
        let config = client_config(tls, &transport)?;
        let endpoint = Endpoint::client(addr)?;
        let pool = Pool::new(
            limits.peers_max,
            limits.backoff_base_ms,
            limits.backoff_max_ms,
        );
        Ok(Client {
            inner: Arc::new(Inner {
                endpoint,
                config: std::sync::RwLock::new(config),
                transport,
                limits,
                pool,
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// Presents `tls`'s certificate and trusts its CA and revocation lists
    /// on every connection made from now on (and by its clones; a peer it
    /// was backing off from is tried at the next request); open
    /// connections go on as they are.
    pub fn reload(&self, tls: &TlsIdentity) -> Result<(), NetError> {
        let config = client_config(tls, &self.inner.transport)?;
        *self.inner.config.write().expect("never poisoned") = config;
        self.inner.pool.forget_backoffs();
        Ok(())
    }

    /// Closes every connection of this client (and of its clones) and waits,
    /// at most [`CLIENT_CLOSE_WAIT_MS`], until the servers were told: they
    /// free the connections at once. Requests after this fail. Call it
    /// before a program exits.
    ///
    /// A close is told once its CONNECTION_CLOSE datagram was sent: after
    /// the close a connection sends nothing else, so its sent-datagram count
    /// moving past where it stood at the close says so (quinn counts a
    /// datagram as it builds it and hands it to the socket in the same step,
    /// unless the socket is full). A short CLI call pays about a
    /// millisecond, not QUIC's draining period (three probe timeouts). When
    /// a datagram was sent between the two reads around the close (the
    /// connection's driver ran on another thread meanwhile), whether it
    /// carried the close is not known, and the close waits until the
    /// endpoint has drained instead: on a current-thread runtime that never
    /// happens.
    pub async fn close(&self) {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_millis(CLIENT_CLOSE_WAIT_MS);
        let mut closing = Vec::new();
        let mut drain = false;
        for connection in inner.pool.live_connections() {
            let before = sent_datagrams(&connection);
            connection.close(CODE_CLIENT_CLOSED, b"client closed");
            let at_close = sent_datagrams(&connection);
            match connection.close_reason() {
                // The peer had closed it first: nothing to tell.
                Some(reason) if reason != ConnectionError::LocallyClosed => {}
                _ if at_close != before => drain = true,
                _ => closing.push((connection, at_close)),
            }
        }
        // Connections still in their handshake are in no pool slot.
        inner.endpoint.close(CODE_CLIENT_CLOSED, b"client closed");
        let told = if drain {
            tokio::time::timeout_at(deadline.into(), inner.endpoint.wait_idle())
                .await
                .is_ok()
        } else {
            loop {
                closing.retain(|(connection, at_close)| sent_datagrams(connection) == *at_close);
                if closing.is_empty() {
                    break true;
                }
                if Instant::now() >= deadline {
                    break false;
                }
                tokio::time::sleep(CLOSE_POLL).await;
            }
        };
        if !told {
            debug!(
                wait_ms = CLIENT_CLOSE_WAIT_MS,
                "client close: connections still closing"
            );
        }
    }

    /// Sends `request` to `peer` and returns its reply. A [`Reply::Error`]
    /// is the peer's answer; a [`NetError`] means no answer arrived (for
    /// [`NetError::Closed`] and [`NetError::Timeout`] the peer may still have
    /// processed the request).
    pub async fn request(&self, peer: &Peer, request: &Request) -> Result<Reply, NetError> {
        let frame = wire::encode(request).map_err(|_| NetError::FrameTooLarge {
            max: wire::FRAME_BYTES_MAX,
        })?;
        let limits = &self.inner.limits;
        if frame.len() > limits.frame_bytes_max {
            return Err(NetError::FrameTooLarge {
                max: limits.frame_bytes_max,
            });
        }
        // A request that asks to wait gets that much more time.
        let timeout_ms = limits.request_timeout_ms + u64::from(request.wait_ms());
        tokio::time::timeout(
            Duration::from_millis(timeout_ms),
            self.exchange(peer, request, &frame),
        )
        .await
        .map_err(|_| NetError::Timeout {
            peer: peer.addr,
            timeout_ms,
        })?
    }

    /// The protocol version this client and `peer` speak (the newest both
    /// do), connecting if there is no pooled connection.
    pub async fn version(&self, peer: &Peer) -> Result<u16, NetError> {
        Ok(self.connection(peer).await?.version)
    }

    async fn exchange(
        &self,
        peer: &Peer,
        request: &Request,
        frame: &[u8],
    ) -> Result<Reply, NetError> {
        let Pooled {
            mut connection,
            version,
        } = self.connection(peer).await?;
        wire::check_version(request, version).map_err(|e| NetError::NotSpoken {
            peer: peer.addr,
            request: request.kind(),
            needs: e.needs,
            speaks: e.speaks,
        })?;
        let closed = |connection: &Connection, reason: String| {
            refusal(peer, connection).unwrap_or(NetError::Closed {
                peer: peer.addr,
                reason,
            })
        };
        let (mut send, mut recv) = match connection.open_bi().await {
            Ok(streams) => streams,
            // The pooled connection died since it was last used; nothing was
            // sent yet, so one fresh connection is safe to try.
            Err(_) => {
                connection = self.connection(peer).await?.connection;
                connection
                    .open_bi()
                    .await
                    .map_err(|e| closed(&connection, e.to_string()))?
            }
        };
        // Until the reply is in, the connection is suspect: an error, this
        // request's timeout or the caller giving up evicts it from the pool.
        // A homing server that restarted answers our next packet with a
        // stateless reset we recognise (its keys derive from its identity),
        // but a peer that is gone, or restarted with another identity, cannot
        // be told apart from a slow one: without this every request to it
        // would wait for the idle timeout.
        let suspect = EvictUnlessAnswered {
            pool: &self.inner.pool,
            peer,
            connection: &connection,
            answered: false,
        };
        frame::write_frame(&mut send, frame)
            .await
            .map_err(|reason| closed(&connection, reason))?;
        let bytes = frame::read_frame(&mut recv, self.inner.limits.frame_bytes_max)
            .await
            .map_err(|error| match error {
                ReadFrameError::TooLarge => NetError::FrameTooLarge {
                    max: self.inner.limits.frame_bytes_max,
                },
                ReadFrameError::Closed(reason) => closed(&connection, reason),
                ReadFrameError::OverBudget { .. } => {
                    unreachable!("replies are read without a budget")
                }
            })?;
        suspect.answered();
        wire::decode_for(version, &bytes).map_err(NetError::Malformed)
    }

    async fn connection(&self, peer: &Peer) -> Result<Pooled, NetError> {
        let inner = &self.inner;
        inner
            .pool
            .connection(peer, || async {
                let connect_error = |reason: String| NetError::Connect {
                    peer: peer.addr,
                    reason,
                };
                let connecting = inner
                    .endpoint
                    .connect_with(
                        inner.config.read().expect("never poisoned").clone(),
                        peer.addr,
                        &node_server_name(&peer.dc),
                    )
                    .map_err(|e| connect_error(e.to_string()))?;
                let timeout = Duration::from_millis(inner.limits.connect_timeout_ms);
                let connection = match tokio::time::timeout(timeout, connecting).await {
                    Ok(Ok(connection)) => connection,
                    Ok(Err(error)) => return Err(connect_error(error.to_string())),
                    Err(_) => {
                        let reason = format!(
                            "handshake timed out after {} ms",
                            inner.limits.connect_timeout_ms
                        );
                        return Err(connect_error(reason));
                    }
                };
                // The server name already binds the certificate to the DC; this
                // also insists that the identity URI says node of that DC.
                match peer_identity(&connection) {
                    Ok(identity)
                        if identity.role() == Role::Node && identity.dc() == Some(&peer.dc) =>
                    {
                        let version = connection_version(&connection).map_err(|e| {
                            connection.close(CODE_BAD_IDENTITY, b"no protocol version agreed");
                            connect_error(e.to_string())
                        })?;
                        Ok(Pooled {
                            connection,
                            version,
                        })
                    }
                    Ok(identity) => {
                        connection.close(CODE_BAD_IDENTITY, b"not the expected node");
                        Err(connect_error(format!(
                            "peer is {identity}, expected node@{}",
                            peer.dc
                        )))
                    }
                    Err(error) => {
                        connection
                            .close(CODE_BAD_IDENTITY, b"certificate names no homing identity");
                        Err(connect_error(error.to_string()))
                    }
                }
            })
            .await
    }
}

/// The server's refusal, if it closed `connection` because the caller's
/// share of its connections is full.
fn refusal(peer: &Peer, connection: &Connection) -> Option<NetError> {
    match connection.close_reason()? {
        ConnectionError::ApplicationClosed(close) if close.error_code == CODE_REFUSED => {
            Some(NetError::Refused {
                peer: peer.addr,
                reason: String::from_utf8_lossy(&close.reason).into_owned(),
            })
        }
        _ => None,
    }
}

/// Evicts a pooled connection when dropped before [`Self::answered`].
struct EvictUnlessAnswered<'a> {
    pool: &'a Pool,
    peer: &'a Peer,
    connection: &'a Connection,
    answered: bool,
}

impl EvictUnlessAnswered<'_> {
    fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for EvictUnlessAnswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.pool.evict(self.peer, self.connection);
        }
    }
}

/// The QUIC client configuration presenting `tls` over `transport`.
fn client_config(
    tls: &TlsIdentity,
    transport: &Arc<quinn::TransportConfig>,
) -> Result<quinn::ClientConfig, NetError> {
    let crypto = QuicClientConfig::try_from(tls.rustls_client_config()?)
        .map_err(|e| NetError::Tls(e.to_string()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(transport.clone());
    Ok(config)
}
