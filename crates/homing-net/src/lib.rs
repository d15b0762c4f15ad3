//! homing-net: the QUIC transport between edge routers, host agents and DC
//! daemons. quinn + rustls with the ring provider, TLS 1.3 only, mutual TLS:
//! every peer presents a certificate from the deployment's CA whose SAN URI
//! `homing://<role>[/<dc>]` names its [`homing_core::Identity`]. The ALPN
//! (`homing/<version>`) carries the protocol version: each side offers
//! every version it speaks (this release's and the previous one's), a
//! connection uses the newest both speak, and no message newer than that
//! crosses it. Each request is one bidirectional
//! stream holding one postcard frame each way, over one pooled connection per
//! peer; the server authorizes every request by the caller's certificate.
//!
//! ```no_run
//! # async fn example(handler: std::sync::Arc<dyn homing_net::Handler>) -> Result<(), Box<dyn std::error::Error>> {
//! use homing_core::{DcId, Identity, Key, KeyName, Request, Role};
//! use homing_net::{Client, ClientLimits, DevCa, Peer, Server, ServerLimits};
//! let iad = DcId::new("iad")?;
//! // A dev CA; production loads PEM files with `TlsIdentity::load_pem`.
//! let ca = DevCa::generate("test ca")?;
//! let node = ca.tls_identity(&Identity::new(Role::Node, Some(iad.clone()))?)?;
//! let server = Server::bind("127.0.0.1:0".parse()?, &node, iad.clone(),
//!     ServerLimits::default(), handler).await?;
//! let router = Client::new(&ca.tls_identity(&Identity::new(Role::Router, None)?)?, ClientLimits::default())?;
//! let peer = Peer { addr: server.local_addr(), dc: iad };
//! let reply = router.request(&peer, &Request::Resolve { key: Key::new(KeyName::new("room")?) }).await?;
//! server.shutdown().await;
//! # let _ = reply; Ok(()) }
//! ```

mod admission;
mod client;
mod dc_table;
mod error;
pub mod frame;
pub mod identity;
pub mod limits;
mod loopback;
pub mod pki;
mod pool;
pub mod relay;
pub mod reload;
mod server;
mod stats;
mod tls;
mod unacked;

pub use admission::Refusal;
pub use client::Client;
pub use dc_table::{DC_TABLE_ADDRS_MAX, DcTable, DcTableCounters, OnChange, Unanswered};
pub use error::NetError;
pub use identity::{CertIdentityError, identity_from_cert, identity_uri, node_server_name};
pub use limits::{ClientLimits, ConnectionShares, ServerLimits};
pub use loopback::loopback_listen_addr;
pub use pki::{DevCa, IssuedCert, PkiError, generate_dev_pki};
pub use pool::Peer;
pub use relay::Relay;
pub use server::{Handler, Server, ServerReloader};
pub use stats::{CloseKind, ConnectionStats, ServerStats};
pub use tls::{FilesStamp, TlsFiles, TlsIdentity};

/// Locks `mutex`, ignoring poisoning: every critical section in this crate
/// is a few reads and assignments that leave the state consistent even if a
/// panic interrupts the holder.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
