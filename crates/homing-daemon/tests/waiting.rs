//! Acquire with `wait_ms` through real homingd instances (an in-process
//! devnet over QUIC): a parked acquirer is woken by the holder's release or
//! lease expiry — not by polling, not by the reaper — in registration order,
//! learns how the previous run ended, and gives up with `HeldElsewhere` when
//! its wait runs out. The tests order their steps by events (a waiter counted
//! as parked in the tail's DC), never by sleeps; the only durations asserted
//! are lower bounds and margins of tens of seconds (a lease that would have
//! had to run out).

use homing_core::{AcquireReply, Grant, Holder};
use std::time::{Duration, Instant};

use homing_core::{
    ActorId, DcId, ErrorKind, FailureReason, KeyConfig, KeyName, PreviousRun, ReleaseCause,
    ReleaseReply, Reply, Request, Role, RunOutcome,
};
use homing_daemon::{Devnet, DevnetOptions, Settings};
use homing_net::Client;

mod support;
use support::{held, lease_of, now};

fn dc(name: &str) -> DcId {
    DcId::new(name).unwrap()
}

/// Short leases; a reaper too slow to matter, so expiry must come from the
/// waiter's own timer.
fn settings(lease_ttl_ms: u64) -> Settings {
    Settings {
        lease_ttl_ms: Some(lease_ttl_ms),
        soft_margin_ms: Some(500),
        hard_margin_ms: Some(250),
        grace_ms: Some(300),
        reaper_interval_ms: Some(600_000),
        handoff_ms: Some(1_000),
        waiters_per_key_max: Some(2),
        ..Settings::default()
    }
}

async fn devnet(dcs: &[&str], lease_ttl_ms: u64) -> Devnet {
    Devnet::start(DevnetOptions {
        dcs: dcs.iter().map(|d| dc(d)).collect(),
        overrides: settings(lease_ttl_ms),
        ..DevnetOptions::default()
    })
    .await
    .unwrap()
}

fn acquire(name: &str, actor: &str, wait_ms: u32) -> Request {
    Request::Acquire {
        lease: lease_of(actor),
        config: KeyConfig::named(KeyName::new(name).unwrap()),
        actor: ActorId::new(actor).unwrap(),
        host_time: now(),
        wait_ms,
    }
}

struct Host {
    client: Client,
    net_dc: DcId,
}

impl Host {
    fn new(net: &Devnet, at: &str) -> Host {
        Host {
            client: net.client(Role::Host, Some(&dc(at))).unwrap(),
            net_dc: dc(at),
        }
    }

    async fn ask(&self, net: &Devnet, request: &Request) -> Reply {
        self.client
            .request(&net.peer(&self.net_dc), request)
            .await
            .unwrap()
    }
}

/// Leases long enough that only a release ends a wait in time: a waiter
/// that missed the release would wait for this, plus grace.
const LONG_LEASE_MS: u64 = 30_000;

/// Returns once `n` acquirers are parked on reservations of DC `at` (a
/// waiter in another DC parks in the tail's DC).
async fn parked(net: &Devnet, at: &str, n: usize) {
    let node = net
        .dcs()
        .iter()
        .find(|d| d.id == dc(at))
        .expect("a dc of the devnet")
        .daemon
        .node()
        .clone();
    while node.waiting() != n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn previous(reply: &Reply) -> Option<PreviousRun> {
    match reply {
        Reply::Acquire(AcquireReply::Acquired(Grant { previous, .. })) => previous.clone(),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test finished within 60 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_dc_takes_the_key_when_the_holder_releases_and_learns_it_failed() {
    bounded(async {
        let net = devnet(&["iad", "fra"], LONG_LEASE_MS).await;
        let (iad, fra) = (Host::new(&net, "iad"), Host::new(&net, "fra"));
        let first_acquired_at = Instant::now();
        let (first, token) = held(&iad.ask(&net, &acquire("room", "iad-actor", 0)).await);

        let waiting = {
            let request = acquire("room", "fra-actor", 50_000);
            let peer = net.peer(&dc("fra"));
            let client = fra.client.clone();
            tokio::spawn(async move {
                let reply = client.request(&peer, &request).await.unwrap();
                (reply, Instant::now())
            })
        };
        parked(&net, "iad", 1).await;
        assert!(!waiting.is_finished(), "the key is held: fra waits");
        let reason = FailureReason::new("actor crashed: out of memory").unwrap();
        let release = Request::Release {
            lease: lease_of("iad-actor"),
            reservation: first.clone(),
            token,
            outcome: RunOutcome::Failed {
                reason: reason.clone(),
            },
        };
        assert_eq!(
            iad.ask(&net, &release).await,
            Reply::Release(ReleaseReply::Released)
        );
        let (reply, acquired_at) = waiting.await.unwrap();
        let (second, second_token) = held(&reply);
        assert_eq!(second.dc(), &dc("fra"), "recreated in the waiter's dc");
        assert!(second_token > token);
        assert_eq!(
            previous(&reply),
            Some(PreviousRun {
                reservation: first,
                token,
                ended: ReleaseCause::Released(RunOutcome::Failed { reason }),
            })
        );
        // Woken by the release: without it, the wait would have lasted until
        // the lease ran out.
        assert!(
            acquired_at.duration_since(first_acquired_at) < Duration::from_millis(LONG_LEASE_MS),
            "acquired only {:?} after the first holder: not woken by the release",
            acquired_at.duration_since(first_acquired_at)
        );
        net.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_is_taken_only_after_expiry_plus_grace_without_the_reaper() {
    bounded(async {
        let net = devnet(&["iad"], 1_500).await;
        let iad = Host::new(&net, "iad");
        let started = Instant::now();
        let (first, token) = held(&iad.ask(&net, &acquire("lapsing", "a1", 0)).await);
        // The holder never renews. ttl 1500 + grace 300 ⇒ reapable at ~1.8 s.
        let reply = iad.ask(&net, &acquire("lapsing", "a2", 20_000)).await;
        let waited = started.elapsed();
        let (again, next_token) = held(&reply);
        assert_eq!(again, first, "same-dc re-activation");
        assert_eq!(next_token, token.next());
        assert_eq!(previous(&reply).unwrap().ended, ReleaseCause::Expired);
        // Not before expiry + grace; and acquired at all within its wait,
        // with the reaper 10 minutes away: the waiter's own timer fired.
        assert!(
            waited >= Duration::from_millis(1_800),
            "acquired after {waited:?}: before expiry + grace"
        );
        net.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_order_bounded_and_time_out_with_held_elsewhere() {
    bounded(async {
        let net = devnet(&["iad"], LONG_LEASE_MS).await;
        let iad = Host::new(&net, "iad");
        let (first, token) = held(&iad.ask(&net, &acquire("busy", "holder", 0)).await);

        let spawn_wait = |actor: &'static str, wait_ms: u32| {
            let request = acquire("busy", actor, wait_ms);
            let peer = net.peer(&dc("iad"));
            let client = iad.client.clone();
            tokio::spawn(async move { client.request(&peer, &request).await.unwrap() })
        };
        let a = spawn_wait("waiter-a", 50_000);
        parked(&net, "iad", 1).await;
        // b's wait outlasts the few requests until the release by seconds,
        // and runs out long before a's lease would.
        let b = spawn_wait("waiter-b", 5_000);
        parked(&net, "iad", 2).await;
        // waiters_per_key_max = 2: a third is refused at once.
        match iad.ask(&net, &acquire("busy", "waiter-c", 5_000)).await {
            Reply::Error(e) => assert_eq!(e.kind, ErrorKind::Overloaded, "{e}"),
            other => panic!("expected Overloaded, got {other:?}"),
        }
        let release = Request::Release {
            lease: lease_of("holder"),
            reservation: first.clone(),
            token,
            outcome: RunOutcome::Ok,
        };
        iad.ask(&net, &release).await;
        // The first registered gets the key; the second keeps waiting on the
        // new holder until its wait runs out.
        let a = a.await.unwrap();
        assert_eq!(held(&a).1, token.next());
        match b.await.unwrap() {
            Reply::Acquire(AcquireReply::HeldElsewhere(Holder { actor, .. })) => {
                assert_eq!(actor.as_str(), "waiter-a")
            }
            other => panic!("expected HeldElsewhere, got {other:?}"),
        }
        net.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutting_down_homingd_answers_an_acquire_waiting_at_another_dc_at_once() {
    bounded(async {
        let net = devnet(&["iad", "fra"], LONG_LEASE_MS).await;
        let (iad, fra) = (Host::new(&net, "iad"), Host::new(&net, "fra"));
        held(&iad.ask(&net, &acquire("room", "iad-actor", 0)).await);
        let waiting = {
            let request = acquire("room", "fra-actor", 50_000);
            let peer = net.peer(&dc("fra"));
            let client = fra.client.clone();
            tokio::spawn(async move { client.request(&peer, &request).await.unwrap() })
        };
        parked(&net, "iad", 1).await;
        let started = Instant::now();
        // fra's homingd begins its graceful shutdown (`Daemon::shutdown`
        // closes the node first): its acquire registered at iad must not
        // hold the shutdown for the rest of its 50 s wait.
        let fra_node = net.dcs().iter().find(|d| d.id == dc("fra")).unwrap();
        fra_node.daemon.node().close();
        let reply = waiting.await.unwrap();
        assert!(
            matches!(reply, Reply::Acquire(AcquireReply::HeldElsewhere(_))),
            "{reply:?}"
        );
        // The wait was 50 s; answered at the close, not at its end.
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "answered {:?} after the close",
            started.elapsed()
        );
        net.shutdown().await;
    })
    .await;
}
