//! Certificates that change while a process runs: every `interval` the
//! CA, certificate, key and revocation-list files ([`TlsFiles`]) are looked
//! at, and when one changed they are loaded again and handed to every
//! [`Reloadable`] — a [`crate::Server`] (through its [`ServerReloader`]) or
//! a [`Client`] — which use them for connections made from then on. Open
//! connections go on with what they started with. Files that do not load
//! (half written, a key that does not match) are logged and the identity in
//! use is kept; the next change is tried again.

use std::future::Future;
use std::time::Duration;

use crate::client::Client;
use crate::error::NetError;
use crate::server::ServerReloader;
use crate::tls::{TlsFiles, TlsIdentity};

/// Default of how often a process looks at its TLS files, ms.
pub const TLS_RELOAD_MS_DEFAULT: u64 = 5_000;

/// What takes a new identity for its next connections.
pub trait Reloadable: Send + Sync {
    /// Use `tls` for connections made from now on.
    fn reload(&self, tls: &TlsIdentity) -> Result<(), NetError>;
}

impl Reloadable for Client {
    fn reload(&self, tls: &TlsIdentity) -> Result<(), NetError> {
        Client::reload(self, tls)
    }
}

impl Reloadable for ServerReloader {
    fn reload(&self, tls: &TlsIdentity) -> Result<(), NetError> {
        ServerReloader::reload(self, tls)
    }
}

/// Looks at `files` every `interval` until `stopped` completes, handing
/// what they hold to every one of `targets` when they change. A zero
/// `interval` returns at once: nothing is reloaded.
pub async fn watch_files(
    files: TlsFiles,
    interval: Duration,
    targets: Vec<Box<dyn Reloadable>>,
    stopped: impl Future<Output = ()>,
) {
    if interval.is_zero() {
        return;
    }
    let mut stopped = std::pin::pin!(stopped);
    let mut seen = files.stamp();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = &mut stopped => return,
        }
        let now = files.stamp();
        if now == seen {
            continue;
        }
        seen = now;
        let reloaded = files.load().and_then(|tls| {
            for target in &targets {
                target.reload(&tls)?;
            }
            Ok(tls.crls())
        });
        match reloaded {
            Ok(crls) => tracing::info!(
                cert = %files.cert.display(),
                crls,
                "certificates reloaded: new connections use them, open ones go on"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "certificate files changed but do not load: the ones in use are kept"
            ),
        }
    }
}
