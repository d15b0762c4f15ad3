//! Several homingd serving one DC over one shared DC store (DESIGN.md §7.1,
//! OPERATIONS "Several homingd per DC"): a write made through one instance
//! wakes the waiters and watchers parked at another, through the DC store's
//! event log (`log_follow_ms`), not through the process that wrote. The
//! tests order their steps by events (a waiter counted as parked, a watch
//! counted as parked); the 20 s bound only catches a wake-up that never comes
//! (the waits asked for are 50 s).

use std::sync::Arc;
use std::time::Duration;

use homing_core::{
    ActorId, DcId, EventKind, Identity, KeyConfig, KeyName, NamespaceScope, ReleaseReply, Reply,
    Request, Role, RunOutcome,
};
use homing_daemon::{Daemon, Settings};
use homing_net::Handler;
use homing_store::{DcStore, GlobalStore, MemoryDcStore, MemoryGlobalStore};

mod support;
use support::{held, lease_of, now};

/// Long leases and no reaper to speak of: only the release can end a wait in time.
fn settings() -> Settings {
    Settings {
        lease_ttl_ms: Some(60_000),
        reaper_interval_ms: Some(600_000),
        log_follow_ms: Some(20),
        ..Settings::default()
    }
}

/// Two homingd of `iad` on one global store and one DC store.
async fn two_instances() -> (Daemon, Daemon, Vec<tempfile::TempDir>) {
    let ca = homing_net::DevCa::generate("instances test ca").unwrap();
    let global: Arc<dyn GlobalStore> = Arc::new(MemoryGlobalStore::new());
    let records: Arc<dyn DcStore> = Arc::new(MemoryDcStore::new());
    let (a, dir_a) =
        support::start_iad_with(&ca, global.clone(), records.clone(), false, settings()).await;
    let (b, dir_b) = support::start_iad_with(&ca, global, records, false, settings()).await;
    (a.unwrap(), b.unwrap(), vec![dir_a, dir_b])
}

fn host() -> Identity {
    Identity::new(Role::Host, Some(DcId::new("iad").unwrap())).unwrap()
}

fn acquire(actor: &str, wait_ms: u32) -> Request {
    Request::Acquire {
        lease: lease_of(actor),
        config: KeyConfig::named(KeyName::new("room").unwrap()),
        actor: ActorId::new(actor).unwrap(),
        host_time: now(),
        wait_ms,
    }
}

/// Returns once `what` holds, polling the daemon's own counters.
async fn until(what: impl Fn() -> bool) {
    while !what() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("{what} within 20 s"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_through_one_instance_wakes_a_waiter_parked_at_another() {
    let (a, b, _dirs) = two_instances().await;
    let (first, token) = held(&a.node().handle(&host(), acquire("first", 0)).await);
    let waiting = {
        let node = b.node().clone();
        tokio::spawn(async move { node.handle(&host(), acquire("second", 50_000)).await })
    };
    bounded(
        "the second acquire parks at b",
        until(|| b.node().waiting() == 1),
    )
    .await;
    let release = Request::Release {
        lease: lease_of("first"),
        reservation: first.clone(),
        token,
        outcome: RunOutcome::Ok,
    };
    assert_eq!(
        a.node().handle(&host(), release).await,
        Reply::Release(ReleaseReply::Released)
    );
    let reply = bounded("b's waiter is woken by a's release", waiting)
        .await
        .unwrap();
    let (second, second_token) = held(&reply);
    assert_eq!(second, first, "re-activated in the same dc");
    assert!(second_token > token);
    // Counted by b's follower right after it delivered the wake-up.
    bounded(
        "b counts the wake-up as the log follower's",
        until(|| b.node().metrics().log_follow_wakeups() >= 1),
    )
    .await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_parked_at_one_instance_sees_an_event_written_through_another() {
    let (a, b, _dirs) = two_instances().await;
    let admin = Identity::new(Role::Admin, None).unwrap();
    let watching = {
        let node = b.node().clone();
        let watch = Request::Watch {
            scope: NamespaceScope::everything(),
            after: 0,
            wait_ms: 50_000,
        };
        tokio::spawn(async move { node.handle(&admin, watch).await })
    };
    bounded(
        "the watch parks at b",
        until(|| b.node().watches_parked() == 1),
    )
    .await;
    let (first, _) = held(&a.node().handle(&host(), acquire("first", 0)).await);
    let reply = bounded("b's watch sees a's write", watching).await.unwrap();
    let Reply::Events { events, .. } = reply else {
        panic!("expected Events, got {reply:?}");
    };
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reservation, first);
    assert!(matches!(events[0].kind, EventKind::Reserved { .. }));
    a.shutdown().await;
    b.shutdown().await;
}
