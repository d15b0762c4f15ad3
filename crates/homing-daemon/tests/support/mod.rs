//! What several of homingd's integration tests share: a host's clock, the
//! grant in an acquire reply, and one DC started in this process on stores
//! the test hands in.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::sync::Arc;

use homing_core::{
    AcquireReply, DcId, FencingToken, Grant, HostTime, Identity, Reply, ReservationId, Role,
};
use homing_daemon::{Config, Daemon, DaemonError, Settings};
use homing_net::DevCa;
use homing_store::{DcStore, GlobalStore};

/// This machine's wall clock as a host clock reading.
pub fn now() -> HostTime {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    HostTime::from_ms(since_epoch.as_millis() as u64)
}

/// The reservation and token an `Acquired` reply grants; panics on any other.
pub fn held(reply: &Reply) -> (ReservationId, FencingToken) {
    match reply {
        Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation, token, ..
        })) => (reservation.clone(), *token),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// DC `iad` of `ca` on `global` and `records`, on loopback (the metrics
/// endpoint too, when `metrics`). The directory holds its (unused) data dir.
pub async fn start_iad(
    ca: &DevCa,
    global: Arc<dyn GlobalStore>,
    records: Arc<dyn DcStore>,
    metrics: bool,
) -> (Result<Daemon, DaemonError>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        dc: Some("iad".into()),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        metrics_listen: metrics.then(|| "127.0.0.1:0".parse().unwrap()),
        data_dir: Some(dir.path().to_path_buf()),
        ca_cert: Some(dir.path().join("unused")),
        cert: Some(dir.path().join("unused")),
        key: Some(dir.path().join("unused")),
        ..Settings::default()
    };
    let config = Config::from_settings(settings).unwrap();
    let iad = DcId::new("iad").unwrap();
    let tls = ca
        .tls_identity(&Identity::new(Role::Node, Some(iad)).unwrap())
        .unwrap();
    (Daemon::start(&config, &tls, global, records).await, dir)
}
