//! homingd when its global store itself fails (not a peer DC): a resolve
//! answers `Unavailable`, never "absent"; `/readyz` turns unready (the
//! store, then the lapsed DC lease) and back while `/healthz` stays up;
//! `/readyz` names the DC store while a full disk fails its writes and
//! turns ready again once the disk has room, without a restart; the
//! metrics endpoint closes a connection that sends nothing; and
//! homingd refuses a DC store that an unfinished migration copies into.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use homing_core::{ErrorKind, ErrorReply, Identity, Key, KeyName, Reply, Request, Role};
use homing_daemon::Daemon;
use homing_net::{DevCa, Handler};
use homing_store::redb::{FillableFile, FullDisk};
use homing_store::{DcStore, GlobalStore, MemoryDcStore, RedbDcStore, RedbOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod support;
use support::TestGlobal;

/// Longest any step here may take on a loaded machine.
const STEP_MS_MAX: u64 = 30_000;

/// A global store that can be switched off: every call then fails as an
/// unreachable backend does.
fn switchable(down: bool) -> Arc<TestGlobal> {
    let global = TestGlobal::default();
    global.down.store(down, Ordering::SeqCst);
    Arc::new(global)
}

async fn start(global: Arc<TestGlobal>) -> (Daemon, tempfile::TempDir) {
    let records = Arc::new(MemoryDcStore::new()) as Arc<dyn DcStore>;
    let (daemon, dir) = start_on(global, records).await;
    (daemon.unwrap(), dir)
}

async fn start_on(
    global: Arc<TestGlobal>,
    records: Arc<dyn DcStore>,
) -> (
    Result<Daemon, homing_daemon::DaemonError>,
    tempfile::TempDir,
) {
    let ca = DevCa::generate("store faults test ca").unwrap();
    support::start_iad(&ca, global as Arc<dyn GlobalStore>, records, true).await
}

/// One GET over a fresh connection: the status code and the body.
async fn get(daemon: &Daemon, path: &str) -> (u16, String) {
    let addr = daemon.metrics_addr().expect("metrics enabled");
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nhost: homingd\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        // One request per connection: the server closes after answering.
        stream.read_to_string(&mut response).await.unwrap();
        response
    };
    let response = tokio::time::timeout(Duration::from_millis(STEP_MS_MAX), exchange)
        .await
        .expect("answered in time");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"));
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    (status, body.to_string())
}

fn room() -> Key {
    Key::new(KeyName::new("room").unwrap())
}

#[tokio::test]
async fn store_faults_a_resolve_when_the_global_store_fails_is_unavailable_never_absent() {
    let global = switchable(true);
    let (daemon, _dir) = start(global.clone()).await;
    let router = Identity::new(Role::Router, None).unwrap();
    let resolve = || {
        daemon
            .node()
            .handle(&router, Request::Resolve { key: room() })
    };
    match resolve().await {
        Reply::Error(ErrorReply {
            kind: ErrorKind::Unavailable { dc },
            ..
        }) => assert_eq!(dc.as_str(), "iad"),
        other => panic!("a resolve with the global store down answered {other:?}"),
    }
    // Back up: the key really is absent, and only now is that the answer.
    global.down.store(false, Ordering::SeqCst);
    match resolve().await {
        Reply::Resolved { entry: None, .. } => {}
        other => panic!("a resolve of an absent key answered {other:?}"),
    }
    daemon.shutdown().await;
}

/// GETs `path` until its status is `status` and its body contains
/// `needle`, within [`STEP_MS_MAX`]; the body.
async fn until_answers(daemon: &Daemon, path: &str, status: u16, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(STEP_MS_MAX);
    loop {
        let (got, body) = get(daemon, path).await;
        if got == status && body.contains(needle) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} still answers {got} {body:?}, not {status} with {needle:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn store_faults_readyz_follows_the_stores_and_the_dc_lease_while_healthz_stays_up() {
    let global = switchable(false);
    let ca = DevCa::generate("store faults test ca").unwrap();
    let records = Arc::new(MemoryDcStore::new()) as Arc<dyn DcStore>;
    // 1 s host leases: the DC lease is 2 s, renewed every 200 ms.
    let short = homing_daemon::Settings {
        lease_ttl_ms: Some(1_000),
        soft_margin_ms: Some(300),
        hard_margin_ms: Some(100),
        renew_at_permille: Some(200),
        grace_ms: Some(100),
        ..homing_daemon::Settings::default()
    };
    let global_store = global.clone() as Arc<dyn GlobalStore>;
    let (daemon, _dir) = support::start_iad_with(&ca, global_store, records, true, short).await;
    let daemon = daemon.unwrap();
    until_answers(&daemon, "/readyz", 200, "ready").await;
    assert_eq!(get(&daemon, "/healthz").await, (200, "ok\n".to_string()));
    global.down.store(true, Ordering::SeqCst);
    // At once the global store's health check fails; within the DC lease's
    // last second it also stops covering a host lease.
    until_answers(&daemon, "/readyz", 503, "switched off").await;
    until_answers(&daemon, "/readyz", 503, "the dc lease is valid for").await;
    // The process still serves: liveness stays up.
    assert_eq!(get(&daemon, "/healthz").await, (200, "ok\n".to_string()));
    global.down.store(false, Ordering::SeqCst);
    until_answers(&daemon, "/readyz", 200, "ready").await;
    let (status, metrics) = get(&daemon, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("# TYPE homing_requests counter"),
        "{metrics}"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn store_faults_readyz_names_the_dc_store_while_a_full_disk_fails_its_writes_then_recovers() {
    let global = switchable(false);
    let dir = tempfile::tempdir().unwrap();
    let (path, disk) = (dir.path().join("iad.dc.redb"), FullDisk::default());
    let open = {
        let disk = disk.clone();
        move || FillableFile::open(&path, &disk)
    };
    let redb = RedbDcStore::on_storage(open, RedbOptions::default()).unwrap();
    let records = Arc::new(redb) as Arc<dyn DcStore>;
    let (daemon, _dir) = start_on(global, records.clone()).await;
    let daemon = daemon.unwrap();
    until_answers(&daemon, "/readyz", 200, "ready").await;
    disk.fill();
    // Any write will do; this one is harmless to a running homingd.
    let refused = records.set_migrating(false).await;
    assert!(
        refused.is_err(),
        "a write on a full disk answered {refused:?}"
    );
    until_answers(&daemon, "/readyz", 503, "dc store").await;
    assert_eq!(get(&daemon, "/healthz").await, (200, "ok\n".to_string()));
    disk.free();
    // No restart: the store opens its file again by itself.
    until_answers(&daemon, "/readyz", 200, "ready").await;
    records.set_migrating(false).await.unwrap();
    daemon.shutdown().await;
}

#[tokio::test]
async fn store_faults_the_metrics_endpoint_closes_a_silent_connection() {
    let global = switchable(false);
    let (daemon, _dir) = start(global).await;
    let addr = daemon.metrics_addr().expect("metrics enabled");
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 256];
    // The server ends it (EOF, or a reset after a timeout response); a
    // server without a read timeout would hold it open forever.
    let ended = tokio::time::timeout(Duration::from_millis(STEP_MS_MAX), async {
        loop {
            match silent.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "a connection that sent nothing is still open"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn store_faults_homingd_refuses_a_dc_store_an_unfinished_migration_copies_into() {
    let global = switchable(false);
    let records = Arc::new(MemoryDcStore::new());
    records.set_migrating(true).await.unwrap();
    let (refused, _dir) = start_on(global.clone(), records.clone()).await;
    let err = refused
        .err()
        .expect("a marked store is refused")
        .to_string();
    assert!(
        err.contains("unfinished `homing migrate`") && err.contains("iad"),
        "{err}"
    );
    // Once the migration finished (cleared its mark), homingd starts.
    records.set_migrating(false).await.unwrap();
    let (started, _dir) = start_on(global, records).await;
    started.unwrap().shutdown().await;
}
