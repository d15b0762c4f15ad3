//! Certificates that change while homingd runs: every `tls_reload_ms` the
//! CA, certificate, key and revocation-list files are looked at, and when
//! one changed they are loaded again and used for every connection made
//! from then on — accepted (the server) and made (to peer DCs). Open
//! connections go on with what they started with. Files that do not load
//! (half written, a key that does not match) are logged and the identity in
//! use is kept; the next change is tried again.

use std::time::Duration;

use homing_net::{Client, ServerReloader, TlsFiles};
use tokio::sync::watch;

/// Watches `files` every `interval` until `stopped`, reloading `server` and
/// `client` when they change.
pub async fn run(
    files: TlsFiles,
    server: ServerReloader,
    client: Client,
    interval: Duration,
    mut stopped: watch::Receiver<bool>,
) {
    let mut seen = files.stamp();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stopped.changed() => return,
        }
        let now = files.stamp();
        if now == seen {
            continue;
        }
        seen = now;
        let reloaded = files.load().and_then(|tls| {
            server.reload(&tls)?;
            client.reload(&tls)?;
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
