//! `Watch`, `Scan` and `DrainScope` through a real homingd (in-process
//! devnet over QUIC): a parked watch wakes on the write that appends an
//! event, scopes cover a namespace or its tree, cursors resume exactly, and a
//! cursor the DC cannot serve is refused instead of silently skipping; an
//! upkeep pass proves orphans against the global store.

use homing_core::{AcquireReply, Grant};
use std::time::{Duration, Instant};

use homing_core::{
    ActorId, DcId, ErrorKind, EventKind, HostTime, KeyConfig, KeyName, Namespace, NamespaceScope,
    Reply, Request, RunOutcome,
};
use homing_daemon::{Devnet, DevnetOptions};
use homing_net::{Client, Peer};

fn iad() -> DcId {
    DcId::new("iad").unwrap()
}

fn now() -> HostTime {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    HostTime::from_ms(since_epoch.as_millis() as u64)
}

fn ns(text: &str) -> Namespace {
    Namespace::new(text).unwrap()
}

fn acquire(namespace: &str, name: &str) -> Request {
    Request::Acquire {
        lease: homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
        config: KeyConfig {
            name: Some(KeyName::new(name).unwrap()),
            namespace: ns(namespace),
            tag: None,
        },
        actor: ActorId::new(format!("actor-{name}")).unwrap(),
        host_time: now(),
        wait_ms: 0,
    }
}

fn watch(scope: NamespaceScope, after: u64, wait_ms: u32) -> Request {
    Request::Watch {
        scope,
        after,
        wait_ms,
    }
}

struct Dc {
    net: Devnet,
    host: Client,
    admin: Client,
    peer: Peer,
}

impl Dc {
    async fn start() -> Dc {
        Dc::start_with(homing_daemon::Settings::default()).await
    }

    async fn start_with(overrides: homing_daemon::Settings) -> Dc {
        let net = Devnet::start(DevnetOptions {
            dcs: vec![iad()],
            overrides,
            ..DevnetOptions::default()
        })
        .await
        .unwrap();
        Dc {
            host: net.client(homing_core::Role::Host, Some(&iad())).unwrap(),
            admin: net.client(homing_core::Role::Admin, None).unwrap(),
            peer: net.peer(&iad()),
            net,
        }
    }

    async fn host(&self, request: &Request) -> Reply {
        self.host.request(&self.peer, request).await.unwrap()
    }

    async fn admin(&self, request: &Request) -> Reply {
        self.admin.request(&self.peer, request).await.unwrap()
    }
}

fn events(reply: Reply) -> (Vec<homing_core::Event>, u64) {
    match reply {
        Reply::Events { events, next } => (events, next),
        other => panic!("expected Events, got {other:?}"),
    }
}

async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test finished within 60 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_watch_wakes_on_the_next_event_and_cursors_resume_exactly() {
    bounded(async {
        let dc = Dc::start().await;
        let everything = NamespaceScope::everything();
        let (none, next) = events(dc.admin(&watch(everything.clone(), 0, 0)).await);
        assert!(none.is_empty() && next == 0);

        let parked = {
            let (client, peer) = (dc.admin.clone(), dc.peer.clone());
            let request = watch(everything.clone(), 0, 20_000);
            tokio::spawn(async move { (client.request(&peer, &request).await, Instant::now()) })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !parked.is_finished(),
            "nothing to report yet: the watch waits"
        );
        let wrote_at = Instant::now();
        let Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation, token, ..
        })) = dc.host(&acquire("games/eu", "room-1")).await
        else {
            panic!("acquire failed");
        };
        let (reply, answered_at) = parked.await.unwrap();
        let (first, next) = events(reply.unwrap());
        assert!(
            answered_at.duration_since(wrote_at) < Duration::from_millis(1_000),
            "woken by the write, not by the 20 s wait"
        );
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].seq, 1);
        assert!(matches!(first[0].kind, EventKind::Reserved { .. }));

        dc.host(&acquire("games/eu/lobbies", "room-2")).await;
        dc.host(&acquire("games/europe", "room-3")).await;
        let release = Request::Release {
            lease: homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
            reservation,
            token,
            outcome: RunOutcome::Ok,
        };
        dc.host(&release).await;

        // Resume after the first event: the rest, in order.
        let (rest, head) = events(dc.admin(&watch(everything.clone(), next, 0)).await);
        let seqs: Vec<u64> = rest.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [2, 3, 4]);
        assert_eq!(head, 4);
        assert!(matches!(
            rest[2].kind,
            EventKind::Released {
                outcome: RunOutcome::Ok,
                ..
            }
        ));

        // A tree scope: games/eu and below, not games/europe.
        let tree = NamespaceScope::subtree(ns("games/eu"));
        let (in_tree, next) = events(dc.admin(&watch(tree, 0, 0)).await);
        let names: Vec<String> = in_tree.iter().map(|e| e.key.to_string()).collect();
        assert_eq!(
            names,
            [
                "games/eu/room-1",
                "games/eu/lobbies/room-2",
                "games/eu/room-1"
            ]
        );
        assert_eq!(next, 4, "skipped events still move the cursor");
        let exact = NamespaceScope::exact(ns("games/eu"));
        let (exact_only, _) = events(dc.admin(&watch(exact, 0, 0)).await);
        assert_eq!(exact_only.len(), 2);

        // A cursor beyond the head is another log's: refused, not a silent wait.
        match dc.admin(&watch(everything.clone(), 99, 0)).await {
            Reply::Error(e) => assert_eq!(e.kind, ErrorKind::BadRequest, "{e}"),
            other => panic!("expected BadRequest, got {other:?}"),
        }
        // A cursor before the oldest kept event: Trimmed, naming the oldest.
        let node = dc.net.dcs()[0].daemon.node().clone();
        let config = homing_daemon::upkeep::UpkeepConfig {
            interval: std::time::Duration::ZERO,
            orphan_age_ms: u64::MAX,
            events_retained: 2,
        };
        let mut upkeep = homing_daemon::upkeep::upkeep(&node, config);
        homing_daemon::upkeep::pass(&node, &mut upkeep).await;
        match dc.admin(&watch(everything.clone(), 1, 0)).await {
            Reply::Error(e) => assert_eq!(e.kind, ErrorKind::Trimmed { oldest: 3 }, "{e}"),
            other => panic!("expected Trimmed, got {other:?}"),
        }
        let (kept, _) = events(dc.admin(&watch(everything, 2, 0)).await);
        assert_eq!(kept.len(), 2, "resuming at oldest - 1 is fine");
        dc.net.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_and_drain_cover_a_namespace_tree_page_by_page() {
    bounded(async {
        let dc = Dc::start().await;
        for i in 0..60 {
            dc.host(&acquire("games/eu", &format!("a{i:02}"))).await;
        }
        dc.host(&acquire("games/eu/lobbies", "b")).await;
        dc.host(&acquire("games/eu-west", "c")).await;
        let tree = NamespaceScope::subtree(ns("games/eu"));
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let scan = Request::Scan {
                scope: tree.clone(),
                after: after.take(),
            };
            match dc.admin(&scan).await {
                Reply::Records { records, next } => {
                    seen.extend(records.into_iter().map(|r| r.key.to_string()));
                    match next {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            seen.len(),
            61,
            "60 in games/eu, 1 below it, none in games/eu-west"
        );
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "key order, no repeats"
        );
        assert!(seen.iter().all(|k| !k.starts_with("games/eu-west")));

        let drain = Request::DrainScope {
            scope: tree.clone(),
            after: None,
        };
        match dc.admin(&drain).await {
            Reply::DrainedPage { drained, next } => {
                assert_eq!((drained, next), (61, None));
            }
            other => panic!("{other:?}"),
        }
        match dc.admin(&drain).await {
            Reply::DrainedPage { drained, .. } => assert_eq!(drained, 0, "already drained"),
            other => panic!("{other:?}"),
        }
        // The router may watch but not scan.
        let router = dc.net.client(homing_core::Role::Router, None).unwrap();
        let scan = Request::Scan {
            scope: tree,
            after: None,
        };
        match router.request(&dc.peer, &scan).await.unwrap() {
            Reply::Error(e) => assert_eq!(e.kind, ErrorKind::Unauthorized),
            other => panic!("{other:?}"),
        }
        dc.net.shutdown().await;
    })
    .await;
}

/// Parked watches are bounded per DC (`watches_parked_max`): one past the
/// bound is answered `Overloaded` at once instead of parking; a watch that
/// does not ask to wait never needs a slot; slots come back when watches
/// answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_watches_are_bounded_per_dc() {
    bounded(async {
        let overrides = homing_daemon::Settings {
            watches_parked_max: Some(2),
            ..homing_daemon::Settings::default()
        };
        let dc = Dc::start_with(overrides).await;
        let node = dc.net.dcs()[0].daemon.node().clone();
        let everything = NamespaceScope::everything();
        let park = || {
            let (client, peer) = (dc.admin.clone(), dc.peer.clone());
            let request = watch(everything.clone(), 0, 20_000);
            tokio::spawn(async move { client.request(&peer, &request).await.unwrap() })
        };
        let parked_until = |n: u64| {
            let node = node.clone();
            async move {
                while node.watches_parked() != n {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let (a, b) = (park(), park());
        parked_until(2).await;
        match dc.admin(&watch(everything.clone(), 0, 20_000)).await {
            Reply::Error(e) => assert_eq!(e.kind, ErrorKind::Overloaded, "{e}"),
            other => panic!("a third parked watch must be refused, got {other:?}"),
        }
        let (none, _) = events(dc.admin(&watch(everything.clone(), 0, 0)).await);
        assert!(none.is_empty(), "a watch that does not wait needs no slot");
        // A write answers both parked watches; their slots come back.
        let Reply::Acquire(AcquireReply::Acquired(_)) = dc.host(&acquire("games", "room-9")).await
        else {
            panic!("acquire failed");
        };
        assert_eq!(events(a.await.unwrap()).0.len(), 1);
        assert_eq!(events(b.await.unwrap()).0.len(), 1);
        parked_until(0).await;
        let c = {
            let (client, peer) = (dc.admin.clone(), dc.peer.clone());
            let request = watch(everything.clone(), 1, 20_000);
            tokio::spawn(async move { client.request(&peer, &request).await.unwrap() })
        };
        parked_until(1).await;
        let Reply::Acquire(AcquireReply::Acquired(_)) = dc.host(&acquire("games", "room-10")).await
        else {
            panic!("acquire failed");
        };
        assert_eq!(events(c.await.unwrap()).0.len(), 1);
        dc.net.shutdown().await;
    })
    .await;
}

/// The upkeep pass's orphan proof through homingd's global store: a
/// released record of this DC whose key's entry names another reservation
/// lost its race and is abandoned; one the entry names is a member and stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upkeep_pass_abandons_a_released_record_the_global_entry_does_not_name() {
    use homing_core::{DcRecord, FencingToken, Holding, Key, LeaseKey, RecordState, ReservationId};
    bounded(async {
        let dc = Dc::start().await;
        let node = dc.net.dcs()[0].daemon.node().clone();
        let lease = LeaseKey::from_bytes([7; 16]).unwrap();
        let holding = Holding {
            actor: ActorId::new("a1").unwrap(),
            lease,
            host_time: now(),
            session: None,
        };
        // Uniques far above the DC's allocator, so no acquire collides.
        let id = |unique: u64| ReservationId::new(iad(), 1 << 40 | unique);
        let released = |unique: u64, name: &str| {
            let key = Key::in_namespace(ns("games"), KeyName::new(name).unwrap());
            let at = homing_daemon::node::store_now();
            let (held, _) = DcRecord::reserve(
                id(unique),
                key.clone(),
                None,
                FencingToken::FIRST,
                None,
                &holding,
                at,
                node.policy(),
            );
            let cancelled = held.cancel(&lease, at).expect("a held record cancels");
            (key, held, cancelled)
        };
        let (lost_key, lost_held, lost) = released(1, "lost");
        let (won_key, won_held, won) = released(2, "won");
        for (held, released) in [(&lost_held, &lost), (&won_held, &won)] {
            node.write(None, true, held, None).await.unwrap();
            node.write(Some(held.version), true, released, None)
                .await
                .unwrap();
        }
        // The lost record's key went to another reservation; the won one's to it.
        node.global()
            .set_if_absent(&lost_key, &id(3))
            .await
            .unwrap();
        node.global().set_if_absent(&won_key, &id(2)).await.unwrap();

        let config = homing_daemon::upkeep::UpkeepConfig {
            interval: Duration::ZERO,
            orphan_age_ms: 0,
            events_retained: 1_000,
        };
        let mut upkeep = homing_daemon::upkeep::upkeep(&node, config);
        homing_daemon::upkeep::pass(&node, &mut upkeep).await;
        let state = |unique| {
            let node = node.clone();
            async move {
                node.records()
                    .get(&id(unique))
                    .await
                    .unwrap()
                    .unwrap()
                    .state
            }
        };
        assert!(
            matches!(state(1).await, RecordState::Abandoned),
            "the orphan"
        );
        assert!(
            matches!(state(2).await, RecordState::Released { .. }),
            "the member stays released"
        );
        dc.net.shutdown().await;
    })
    .await;
}
