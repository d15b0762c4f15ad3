//! One plain HTTP/1.1 GET, for checks (`homing devnet --with-router`) and
//! tests: not a load generator, not a general client.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::net::TcpStream;

/// Largest response body a probe reads, in bytes.
pub const PROBE_BODY_BYTES_MAX: usize = 64 * 1024;
/// Time a probe may take end to end, in milliseconds.
pub const PROBE_TIMEOUT_MS: u64 = 10_000;

/// Why a probe got no answer.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// Connect, send or receive failed.
    #[error("http: {0}")]
    Http(String),
    /// No complete answer within [`PROBE_TIMEOUT_MS`].
    #[error("no answer within {PROBE_TIMEOUT_MS} ms")]
    Timeout,
}

/// GETs `path` from `addr`, with the key header `x-homing-key: key` if
/// given; returns the status and the body (at most [`PROBE_BODY_BYTES_MAX`]).
pub async fn get(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
) -> Result<(StatusCode, Bytes), ProbeError> {
    let timeout = Duration::from_millis(PROBE_TIMEOUT_MS);
    tokio::time::timeout(timeout, get_unbounded(addr, path, key))
        .await
        .map_err(|_| ProbeError::Timeout)?
}

async fn get_unbounded(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
) -> Result<(StatusCode, Bytes), ProbeError> {
    let http = |e: &dyn std::fmt::Display| ProbeError::Http(e.to_string());
    let stream = TcpStream::connect(addr).await.map_err(|e| http(&e))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| http(&e))?;
    tokio::spawn(connection);
    let mut request = Request::get(path).header(hyper::header::HOST, addr.to_string());
    if let Some(key) = key {
        request = request.header(crate::config::KEY_HEADER_DEFAULT, key);
    }
    let request = request.body(Empty::<Bytes>::new()).map_err(|e| http(&e))?;
    let response = sender.send_request(request).await.map_err(|e| http(&e))?;
    let status = response.status();
    let body = Limited::new(response.into_body(), PROBE_BODY_BYTES_MAX)
        .collect()
        .await
        .map_err(|e| http(&e))?
        .to_bytes();
    Ok((status, body))
}
