//! `NetError`: every way a transport operation can fail, in variants a caller
//! can act on (retry later, give up on the peer, fix the configuration).

use std::net::SocketAddr;

use homing_core::FrameError;
use thiserror::Error;

use crate::identity::CertIdentityError;

/// A transport failure.
#[derive(Debug, Error)]
pub enum NetError {
    /// A PEM file or string could not be read or holds no usable item.
    #[error("pem {what}: {reason}")]
    Pem {
        /// Which input (a path, or "ca", "cert", "key" for strings).
        what: String,
        /// Why it was refused.
        reason: String,
    },
    /// The rustls or quinn configuration could not be built from the identity.
    #[error("tls configuration: {0}")]
    Tls(String),
    /// A certificate does not carry a valid homing identity.
    #[error("certificate identity: {0}")]
    Identity(#[from] CertIdentityError),
    /// A limit is zero or above what the wire format allows.
    #[error("invalid limits: {0}")]
    Limits(&'static str),
    /// A socket could not be bound or used.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The connection to a peer could not be established (handshake failed,
    /// certificate refused, peer unreachable).
    #[error("connect to {peer}: {reason}")]
    Connect {
        /// The peer's address.
        peer: SocketAddr,
        /// What failed.
        reason: String,
    },
    /// A recent connect to this peer failed; no new attempt is made before
    /// the backoff ends.
    #[error("peer {peer} unreachable, next connect attempt in {retry_in_ms} ms")]
    Backoff {
        /// The peer's address.
        peer: SocketAddr,
        /// How long until the next attempt is allowed.
        retry_in_ms: u64,
    },
    /// The pool holds connections to as many peers as its limit allows.
    #[error("connection pool full ({peers_max} peers)")]
    PoolFull {
        /// The limit.
        peers_max: usize,
    },
    /// The request was not answered within the request timeout.
    #[error("request to {peer} timed out after {timeout_ms} ms")]
    Timeout {
        /// The peer's address.
        peer: SocketAddr,
        /// The timeout that expired.
        timeout_ms: u64,
    },
    /// A frame (request to send or reply received) exceeds the frame limit.
    #[error("frame exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// The limit, in bytes.
        max: usize,
    },
    /// The peer's reply is not a valid frame.
    #[error("malformed reply: {0}")]
    Malformed(FrameError),
    /// The server finished the handshake but refused the connection: the
    /// caller's share of its connections is full. No request was processed.
    #[error("connection to {peer} refused: {reason}")]
    Refused {
        /// The peer's address.
        peer: SocketAddr,
        /// The server's reason, naming the role and the share that was full.
        reason: String,
    },
    /// The peer speaks an older protocol version than the request needs
    /// (it runs the previous release): nothing was sent.
    #[error("{peer} speaks protocol version {speaks}; {request} needs {needs}")]
    NotSpoken {
        /// The peer's address.
        peer: SocketAddr,
        /// The request kind.
        request: &'static str,
        /// The version the request arrived in.
        needs: u16,
        /// The connection's version.
        speaks: u16,
    },
    /// The connection or stream was closed or reset before the reply arrived;
    /// the request may or may not have been processed.
    #[error("connection to {peer} closed: {reason}")]
    Closed {
        /// The peer's address.
        peer: SocketAddr,
        /// Why, as reported by quinn.
        reason: String,
    },
}

impl NetError {
    /// What this error says about the peer: `Some(true)` it answered (if
    /// only to refuse or with garbage), `Some(false)` it was not reached
    /// (timeout, no connection, connection lost: a caller may hold it
    /// suspect), `None` nothing (a local error).
    pub fn reached_peer(&self) -> Option<bool> {
        match self {
            NetError::Timeout { .. }
            | NetError::Connect { .. }
            | NetError::Backoff { .. }
            | NetError::Closed { .. }
            | NetError::Io(_) => Some(false),
            NetError::Refused { .. } | NetError::NotSpoken { .. } | NetError::Malformed(_) => {
                Some(true)
            }
            NetError::Pem { .. }
            | NetError::Tls(_)
            | NetError::Identity(_)
            | NetError::Limits(_)
            | NetError::PoolFull { .. }
            | NetError::FrameTooLarge { .. } => None,
        }
    }
}
