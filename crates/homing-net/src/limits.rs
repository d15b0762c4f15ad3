//! Bounds on what a server or client holds at once, with their defaults as
//! named constants. Every queue, stream count and timeout has one.

use homing_core::wire::FRAME_BYTES_MAX;

use crate::error::NetError;

/// Default most connections a server holds; extra incoming ones are refused.
pub const CONNECTIONS_MAX: usize = 4096;
/// Default connections kept free for peers (node certificates): far more
/// than the DCs of any deployment, each of which pools one connection.
pub const NODE_CONNECTIONS_RESERVED: usize = 256;
/// Default connections kept free for hosts of the server's own DC.
pub const HOST_CONNECTIONS_RESERVED: usize = 1024;
/// Default most connections one certificate may hold.
pub const IDENTITY_CONNECTIONS_MAX: usize = 1024;
/// Default most TLS handshakes in progress at once. Handshakes hold no
/// connection slot; half of them are kept for callers whose address was
/// validated (by a QUIC Retry), so forged Initials cannot take them all.
pub const HANDSHAKES_MAX: usize = 512;
/// Default time a handshake may take before it is abandoned, in milliseconds
/// (a client gives up after [`CONNECT_TIMEOUT_MS`] too).
pub const HANDSHAKE_TIMEOUT_MS: u64 = 5_000;
/// Default size asked for the server's UDP receive buffer, in bytes (the
/// kernel caps it at `net.core.rmem_max`; see OPERATIONS.md).
pub const UDP_RECEIVE_BUFFER_BYTES: usize = 8 * 1024 * 1024;
/// How often failed handshakes and refused connections are summed up in one
/// log line, in milliseconds.
pub const FAILURE_SUMMARY_INTERVAL_MS: u64 = 10_000;
/// Default most concurrent request streams per connection (quinn's default is 100).
pub const STREAMS_MAX: u32 = 1024;
/// Default idle time after which a connection is closed, in milliseconds.
pub const IDLE_TIMEOUT_MS: u64 = 30_000;
/// Default keep-alive interval of a server, in milliseconds; below the idle
/// timeout so a pooled connection survives quiet periods.
pub const KEEP_ALIVE_INTERVAL_MS: u64 = 10_000;
/// Default keep-alive interval of a client, in milliseconds: shorter, because
/// a client's ping is also how it learns that its peer restarted (the new
/// process answers it with a stateless reset the client recognises), which
/// ends a request parked on the dead connection within this time.
pub const CLIENT_KEEP_ALIVE_INTERVAL_MS: u64 = 2_000;
/// Default time for one request (read, handle, reply), in milliseconds.
pub const REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Default bytes of request data a server buffers per connection: this much
/// unread in QUIC's buffers (the connection's flow-control window), and this
/// much again in frames the server has partly read.
pub const CONNECTION_RECEIVE_BYTES_MAX: u32 = 4 * 1024 * 1024;
/// Default time `Server::shutdown` waits for in-flight requests, in milliseconds.
pub const SHUTDOWN_DRAIN_MS: u64 = 5_000;
/// Default time a client waits for a handshake, in milliseconds.
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Longest time `Client::close` waits for its connections to be closed, in
/// milliseconds: long enough for the close to be sent and its draining
/// period to pass on a nearby server, short for a program about to exit.
pub const CLIENT_CLOSE_WAIT_MS: u64 = 500;
/// Default first backoff after a failed connect, in milliseconds.
pub const BACKOFF_BASE_MS: u64 = 100;
/// Default longest backoff after repeated failed connects, in milliseconds.
pub const BACKOFF_MAX_MS: u64 = 10_000;
/// Default most peers a client pools connections to.
pub const PEERS_MAX: usize = 1024;

/// How a server's connection slots are divided among its callers. A slot is
/// taken once the caller's certificate is known (after the handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionShares {
    /// Most connections at once.
    pub connections_max: usize,
    /// Slots only peers (node certificates) may take.
    pub node_connections_reserved: usize,
    /// Slots only hosts of the server's own DC may take.
    pub host_connections_reserved: usize,
    /// Most connections one certificate may hold.
    pub identity_connections_max: usize,
}

impl Default for ConnectionShares {
    fn default() -> ConnectionShares {
        ConnectionShares {
            connections_max: CONNECTIONS_MAX,
            node_connections_reserved: NODE_CONNECTIONS_RESERVED,
            host_connections_reserved: HOST_CONNECTIONS_RESERVED,
            identity_connections_max: IDENTITY_CONNECTIONS_MAX,
        }
    }
}

impl ConnectionShares {
    /// The slots reserved for `role` (none for routers and admins).
    pub fn reserved(&self, role: homing_core::Role) -> usize {
        match role {
            homing_core::Role::Node => self.node_connections_reserved,
            homing_core::Role::Host => self.host_connections_reserved,
            homing_core::Role::Router | homing_core::Role::Admin => 0,
        }
    }

    /// Checks the shares; names the first one that does not fit.
    pub fn validate(&self) -> Result<(), NetError> {
        if self.connections_max == 0 {
            return Err(NetError::Limits("connections_max must be at least 1"));
        }
        let reserved = self
            .node_connections_reserved
            .saturating_add(self.host_connections_reserved);
        if reserved >= self.connections_max {
            return Err(NetError::Limits(
                "node_connections_reserved + host_connections_reserved must leave room below connections_max",
            ));
        }
        if self.identity_connections_max == 0 {
            return Err(NetError::Limits(
                "identity_connections_max must be at least 1",
            ));
        }
        Ok(())
    }
}

/// What a [`crate::Server`] allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// How connection slots are divided; connections beyond a share are closed
    /// right after the handshake with a reason naming the share.
    pub shares: ConnectionShares,
    /// Most TLS handshakes in progress; past half of it, callers must prove
    /// their address with a QUIC Retry first; past all of it, they are refused.
    pub handshakes_max: usize,
    /// Abandon a handshake not finished within this time, in milliseconds.
    pub handshake_timeout_ms: u64,
    /// Receive buffer asked of the UDP socket, in bytes (0 keeps the system's).
    pub udp_receive_buffer_bytes: usize,
    /// Most concurrent request streams per connection.
    pub streams_max: u32,
    /// Close a connection idle this long, in milliseconds.
    pub idle_timeout_ms: u64,
    /// Send keep-alives this often, in milliseconds.
    pub keep_alive_interval_ms: u64,
    /// Reset a request stream not answered within this time (plus the
    /// request's own `wait_ms`, for requests that ask to be parked), in milliseconds.
    pub request_timeout_ms: u64,
    /// Largest request frame, in bytes (at most [`FRAME_BYTES_MAX`]).
    pub frame_bytes_max: usize,
    /// Request bytes buffered per connection: the QUIC flow-control window
    /// (unread bytes), and separately the bytes of partly read frames. One
    /// connection makes the server hold at most twice this.
    pub connection_receive_bytes_max: u32,
    /// How long `shutdown` waits for in-flight requests, in milliseconds.
    pub shutdown_drain_ms: u64,
}

impl Default for ServerLimits {
    fn default() -> ServerLimits {
        ServerLimits {
            shares: ConnectionShares::default(),
            handshakes_max: HANDSHAKES_MAX,
            handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS,
            udp_receive_buffer_bytes: UDP_RECEIVE_BUFFER_BYTES,
            streams_max: STREAMS_MAX,
            idle_timeout_ms: IDLE_TIMEOUT_MS,
            keep_alive_interval_ms: KEEP_ALIVE_INTERVAL_MS,
            request_timeout_ms: REQUEST_TIMEOUT_MS,
            frame_bytes_max: FRAME_BYTES_MAX,
            connection_receive_bytes_max: CONNECTION_RECEIVE_BYTES_MAX,
            shutdown_drain_ms: SHUTDOWN_DRAIN_MS,
        }
    }
}

impl ServerLimits {
    /// Checks that every limit is usable; names the first one that is not.
    pub fn validate(&self) -> Result<(), NetError> {
        check_common(
            self.idle_timeout_ms,
            self.request_timeout_ms,
            self.frame_bytes_max,
        )?;
        self.shares.validate()?;
        if self.handshakes_max < 2 {
            return Err(NetError::Limits("handshakes_max must be at least 2"));
        }
        if self.handshake_timeout_ms == 0 {
            return Err(NetError::Limits("handshake_timeout_ms must be at least 1"));
        }
        if self.streams_max == 0 {
            return Err(NetError::Limits("streams_max must be at least 1"));
        }
        if (self.connection_receive_bytes_max as usize) < self.frame_bytes_max {
            return Err(NetError::Limits(
                "connection_receive_bytes_max must hold at least one frame",
            ));
        }
        Ok(())
    }
}

/// What a [`crate::Client`] allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientLimits {
    /// Give up on a handshake after this long, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Give up on a request (including waiting for a stream) after this long
    /// (plus the request's own `wait_ms`), in milliseconds.
    pub request_timeout_ms: u64,
    /// Close a pooled connection idle this long, in milliseconds.
    pub idle_timeout_ms: u64,
    /// Send keep-alives this often, in milliseconds.
    pub keep_alive_interval_ms: u64,
    /// Largest request or reply frame, in bytes (at most [`FRAME_BYTES_MAX`]).
    pub frame_bytes_max: usize,
    /// First wait after a failed connect, in milliseconds; doubles per failure.
    pub backoff_base_ms: u64,
    /// Longest wait between connect attempts, in milliseconds.
    pub backoff_max_ms: u64,
    /// Most peers with a pooled connection.
    pub peers_max: usize,
}

impl Default for ClientLimits {
    fn default() -> ClientLimits {
        ClientLimits {
            connect_timeout_ms: CONNECT_TIMEOUT_MS,
            request_timeout_ms: REQUEST_TIMEOUT_MS,
            idle_timeout_ms: IDLE_TIMEOUT_MS,
            keep_alive_interval_ms: CLIENT_KEEP_ALIVE_INTERVAL_MS,
            frame_bytes_max: FRAME_BYTES_MAX,
            backoff_base_ms: BACKOFF_BASE_MS,
            backoff_max_ms: BACKOFF_MAX_MS,
            peers_max: PEERS_MAX,
        }
    }
}

impl ClientLimits {
    /// Checks that every limit is usable; names the first one that is not.
    pub fn validate(&self) -> Result<(), NetError> {
        check_common(
            self.idle_timeout_ms,
            self.request_timeout_ms,
            self.frame_bytes_max,
        )?;
        if self.connect_timeout_ms == 0 {
            return Err(NetError::Limits("connect_timeout_ms must be at least 1"));
        }
        if self.backoff_max_ms < self.backoff_base_ms {
            return Err(NetError::Limits(
                "backoff_max_ms must be at least backoff_base_ms",
            ));
        }
        if self.peers_max == 0 {
            return Err(NetError::Limits("peers_max must be at least 1"));
        }
        Ok(())
    }
}

fn check_common(
    idle_timeout_ms: u64,
    request_timeout_ms: u64,
    frame_bytes_max: usize,
) -> Result<(), NetError> {
    if idle_timeout_ms == 0 {
        return Err(NetError::Limits("idle_timeout_ms must be at least 1"));
    }
    if request_timeout_ms == 0 {
        return Err(NetError::Limits("request_timeout_ms must be at least 1"));
    }
    if frame_bytes_max == 0 || frame_bytes_max > FRAME_BYTES_MAX {
        return Err(NetError::Limits(
            "frame_bytes_max must be within 1..=wire::FRAME_BYTES_MAX",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_limits_are_named() {
        assert!(ServerLimits::default().validate().is_ok());
        assert!(ClientLimits::default().validate().is_ok());
        let too_big = ServerLimits {
            frame_bytes_max: FRAME_BYTES_MAX + 1,
            ..ServerLimits::default()
        };
        assert!(
            too_big
                .validate()
                .unwrap_err()
                .to_string()
                .contains("frame_bytes_max")
        );
        let no_streams = ServerLimits {
            streams_max: 0,
            ..ServerLimits::default()
        };
        assert!(
            no_streams
                .validate()
                .unwrap_err()
                .to_string()
                .contains("streams_max")
        );
    }
}
