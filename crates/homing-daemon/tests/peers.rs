//! homingd never trusts a peer DC blindly: a peer that answers for a
//! reservation it does not own, or whose chain loops back, makes the request
//! fail with `Inconsistent` — never a wrong answer, never a hang. A peer that
//! does not answer makes it fail with `Unavailable { dc }`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use homing_core::chain::Link;
use homing_core::{
    ActorId, DcId, DcRecord, ErrorKind, ErrorReply, FencingToken, HostTime, Identity, Key,
    KeyConfig, KeyName, LeasePolicy, RecordState, Reply, Request, ReservationId, Role, Segment,
    StoreTime, TailState, TailView,
};
use homing_daemon::{Config, Daemon, Settings};
use homing_net::{Client, ClientLimits, DevCa, Handler, Peer, Server, ServerLimits};
use homing_store::{DcStore, GlobalStore, MemoryDcStore, MemoryGlobalStore};

fn dc(name: &str) -> DcId {
    DcId::new(name).unwrap()
}

fn id(text: &str) -> ReservationId {
    text.parse().unwrap()
}

fn key() -> Key {
    Key::new(KeyName::new("room").unwrap())
}

/// A fake `fra` that answers every ResolveReservation with a fixed segment.
struct Liar {
    segment: Segment,
}

#[async_trait]
impl Handler for Liar {
    async fn handle(&self, _caller: &Identity, request: Request) -> Reply {
        match request {
            Request::ResolveReservation { .. } => Reply::Reservation(self.segment.clone()),
            _ => Reply::Error(ErrorReply::new(
                ErrorKind::Internal,
                "liar answers only resolves",
            )),
        }
    }
}

struct Setup {
    iad: Daemon,
    fra: Option<Server>,
    host: Client,
    _dir: tempfile::TempDir,
}

/// `iad` whose global entry for `room` is `entry`, with `records` in its own
/// store, and a fake `fra` answering `fra_says` (or nothing listening at all).
async fn setup(entry: &str, records: Vec<DcRecord>, fra_says: Option<Segment>) -> Setup {
    let ca = DevCa::generate("peers test ca").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fra = match fra_says {
        Some(segment) => {
            let tls = ca
                .tls_identity(&Identity::new(Role::Node, Some(dc("fra"))).unwrap())
                .unwrap();
            let handler = Arc::new(Liar { segment });
            Some(
                Server::bind(
                    "127.0.0.1:0".parse().unwrap(),
                    &tls,
                    dc("fra"),
                    ServerLimits::default(),
                    handler,
                )
                .await
                .unwrap(),
            )
        }
        None => None,
    };
    // Nothing listens on a port taken from a just-closed socket when fra is absent.
    let fra_addr = fra.as_ref().map_or_else(
        || {
            std::net::UdpSocket::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
        },
        Server::local_addr,
    );
    let global = Arc::new(MemoryGlobalStore::new());
    global.set_if_absent(&key(), &id(entry)).await.unwrap();
    let store = Arc::new(MemoryDcStore::new());
    for record in &records {
        store.compare_and_set(None, record).await.unwrap();
    }
    let settings = Settings {
        dc: Some("iad".into()),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        peers: Some(vec![("fra".into(), fra_addr)]),
        data_dir: Some(dir.path().to_path_buf()),
        ca_cert: Some(dir.path().join("unused")),
        cert: Some(dir.path().join("unused")),
        key: Some(dir.path().join("unused")),
        peer_timeout_ms: Some(500),
        ..Settings::default()
    };
    let config = Config::from_settings(settings).unwrap();
    let tls = ca
        .tls_identity(&Identity::new(Role::Node, Some(dc("iad"))).unwrap())
        .unwrap();
    let iad = Daemon::start(
        &config,
        &tls,
        global as Arc<dyn GlobalStore>,
        store as Arc<dyn DcStore>,
    )
    .await
    .unwrap();
    let host_tls = ca
        .tls_identity(&Identity::new(Role::Host, Some(dc("iad"))).unwrap())
        .unwrap();
    let host = Client::new(&host_tls, ClientLimits::default()).unwrap();
    Setup {
        iad,
        fra,
        host,
        _dir: dir,
    }
}

async fn acquire(setup: &Setup) -> Reply {
    let request = Request::Acquire {
        lease: homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
        config: KeyConfig::named(KeyName::new("room").unwrap()),
        actor: ActorId::new("iad-actor").unwrap(),
        host_time: HostTime::from_ms(1),
        wait_ms: 0,
    };
    let peer = Peer {
        addr: setup.iad.local_addr(),
        dc: dc("iad"),
    };
    tokio::time::timeout(Duration::from_secs(10), setup.host.request(&peer, &request))
        .await
        .expect("answered in time")
        .unwrap()
}

fn linked(from: &str, to: &str) -> DcRecord {
    let (mut record, _) = DcRecord::reserve(
        id(from),
        key(),
        None,
        FencingToken::FIRST,
        None,
        &homing_core::Holding {
            actor: ActorId::new("old").unwrap(),
            lease: homing_core::LeaseKey::from_bytes([1; 16]).unwrap(),
            host_time: HostTime::from_ms(0),
            session: None,
        },
        StoreTime::from_ms(0),
        &LeasePolicy::DEFAULT,
    );
    record.state = RecordState::Linked { to: id(to) };
    record.version = 1;
    record
}

fn error_kind(reply: &Reply) -> Option<&ErrorKind> {
    match reply {
        Reply::Error(e) => Some(&e.kind),
        _ => None,
    }
}

async fn teardown(setup: Setup) {
    setup.iad.shutdown().await;
    if let Some(fra) = setup.fra {
        fra.shutdown().await;
    }
}

#[tokio::test]
async fn peers_a_dc_answering_for_another_dcs_reservation_is_inconsistent() {
    // fra is asked about fra.1 and answers with a tail owned by sin.
    let lie = Segment {
        key: key(),
        shortcut: None,
        links: vec![],
        tail: Some(TailView {
            id: id("sin.3"),
            token: FencingToken::FIRST,
            tag: None,
            state: TailState::Vacant {
                ended: homing_core::ReleaseCause::Expired,
            },
        }),
    };
    let setup = setup("fra.1", vec![], Some(lie)).await;
    let reply = acquire(&setup).await;
    assert_eq!(
        error_kind(&reply),
        Some(&ErrorKind::Inconsistent),
        "{reply:?}"
    );
    teardown(setup).await;
}

#[tokio::test]
async fn peers_a_chain_that_loops_back_is_inconsistent() {
    // iad.1 → fra.1 here; fra claims fra.1 → iad.1: a cycle.
    let lie = Segment {
        key: key(),
        shortcut: None,
        links: vec![Link {
            from: id("fra.1"),
            to: id("iad.1"),
            token: FencingToken::new(2),
        }],
        tail: None,
    };
    let setup = setup("iad.1", vec![linked("iad.1", "fra.1")], Some(lie)).await;
    let reply = acquire(&setup).await;
    match &reply {
        Reply::Error(e) => {
            assert_eq!(e.kind, ErrorKind::Inconsistent);
            assert!(e.message.contains("cycle"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    teardown(setup).await;
}

#[tokio::test]
async fn peers_an_unreachable_tail_dc_is_unavailable_not_not_found() {
    let setup = setup("fra.1", vec![], None).await;
    let reply = acquire(&setup).await;
    assert_eq!(
        error_kind(&reply),
        Some(&ErrorKind::Unavailable { dc: dc("fra") }),
        "{reply:?}"
    );
    let metrics = setup
        .iad
        .node()
        .metrics()
        .requests_total("acquire", "unavailable");
    assert_eq!(metrics, 1);
    // The silent peer is now held suspect, and /metrics says so.
    let text = setup.iad.node().metrics().render();
    assert!(text.contains("homing_peer_suspect{dc=\"fra\"} 1"), "{text}");
    assert!(
        text.contains("homing_peer_suspicions_total{dc=\"fra\"} 1"),
        "{text}"
    );
    teardown(setup).await;
}
