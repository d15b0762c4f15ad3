//! Bounds on what a server or client holds at once, with their defaults as
//! named constants. Every queue, stream count and timeout has one.

use homing_core::wire::FRAME_BYTES_MAX;

use crate::error::NetError;

/// Default most connections a server holds; extra incoming ones are refused.
pub const CONNECTIONS_MAX: usize = 4096;
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
/// Default bytes of unread request data a server buffers per connection.
pub const CONNECTION_RECEIVE_BYTES_MAX: u32 = 4 * 1024 * 1024;
/// Default time `Server::shutdown` waits for in-flight requests, in milliseconds.
pub const SHUTDOWN_DRAIN_MS: u64 = 5_000;
/// Default time a client waits for a handshake, in milliseconds.
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Default first backoff after a failed connect, in milliseconds.
pub const BACKOFF_BASE_MS: u64 = 100;
/// Default longest backoff after repeated failed connects, in milliseconds.
pub const BACKOFF_MAX_MS: u64 = 10_000;
/// Default most peers a client pools connections to.
pub const PEERS_MAX: usize = 1024;

/// What a [`crate::Server`] allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// Most connections at once; extra incoming connections are refused.
    pub connections_max: usize,
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
    /// Unread request bytes buffered per connection (QUIC flow control window).
    pub connection_receive_bytes_max: u32,
    /// How long `shutdown` waits for in-flight requests, in milliseconds.
    pub shutdown_drain_ms: u64,
}

impl Default for ServerLimits {
    fn default() -> ServerLimits {
        ServerLimits {
            connections_max: CONNECTIONS_MAX,
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
        if self.connections_max == 0 {
            return Err(NetError::Limits("connections_max must be at least 1"));
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
