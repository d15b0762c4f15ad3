//! Hostile input against real `homingd` processes and the `Resolver`:
//! garbage datagrams, truncated and oversized frames, keys that break the
//! rules encoded by hand, certificates from another CA, roles asking for
//! what they may not, and a malicious peer DC (a test double speaking the
//! real protocol) that lies, loops, floods or stays silent. Each must give a
//! typed error, leave nothing wrong cached, and leave the daemon serving.

#![cfg(feature = "etcd")]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use homing_client::{ResolveError, Resolver, ResolverConfig};
use homing_core::chain::{HOP_LIMIT_DEFAULT, Link};
use homing_core::wire::{self, FRAME_BYTES_MAX};
use homing_core::{AcquireReply, Holder};
use homing_core::{
    ActorId, DcId, ErrorKind, FencingToken, Identity, Key, Reply, Request, ReservationId, Role,
    Segment, TailState, TailView,
};
use homing_e2e::cluster::{Cluster, acquire, acquire_anew, dc, key, sleep_ms};
use homing_e2e::{ClusterOptions, start_or_skip};
use homing_net::{Client, ClientLimits, DevCa, Handler, Peer, Server, ServerLimits, TlsIdentity};
use homing_store::GlobalStore;
use proptest::prelude::*;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};

const TEST_TIMEOUT: Duration = Duration::from_secs(60);

async fn bounded<F: std::future::Future<Output = ()>>(f: F) {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("test finished within its time bound");
}

// ---------------------------------------------------------------- raw wire

/// A raw QUIC connection to `peer` presenting `tls`, outside homing-net's
/// client, so a test can send frames the client would never send.
async fn raw_connect(tls: &TlsIdentity, peer: &Peer) -> quinn::Connection {
    let crypto = tls.rustls_client_config().expect("client tls config");
    let config = quinn::ClientConfig::new(Arc::new(
        QuicClientConfig::try_from(crypto).expect("tls 1.3 config"),
    ));
    let endpoint =
        quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).expect("client endpoint");
    endpoint
        .connect_with(config, peer.addr, &format!("{}.node.homing", peer.dc))
        .expect("connect starts")
        .await
        .expect("handshake")
}

/// Sends `frame` on a fresh stream and decodes the reply.
async fn raw_exchange(connection: &quinn::Connection, frame: &[u8]) -> Reply {
    let (mut send, mut recv) = connection.open_bi().await.expect("stream opens");
    send.write_all(frame).await.expect("frame written");
    send.finish().expect("stream finished");
    let bytes = recv.read_to_end(FRAME_BYTES_MAX).await.expect("a reply");
    wire::decode(&bytes).expect("the reply decodes")
}

fn varint(mut n: usize, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// `Request::Resolve { key: Key { namespace, name } }` in postcard, built by
/// hand: variant index 0, then each string as a varint length and raw bytes.
fn resolve_frame(namespace: &[u8], name: &[u8]) -> Vec<u8> {
    let mut frame = vec![0];
    varint(namespace.len(), &mut frame);
    frame.extend_from_slice(namespace);
    varint(name.len(), &mut frame);
    frame.extend_from_slice(name);
    frame
}

fn bad_request(reply: &Reply) -> Option<&str> {
    match reply {
        Reply::Error(e) if e.kind == ErrorKind::BadRequest => Some(&e.message),
        _ => None,
    }
}

fn router_tls(cluster: &Cluster) -> TlsIdentity {
    cluster
        .ca()
        .tls_identity(&Identity::new(Role::Router, None).unwrap())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_garbage_truncated_and_oversized_frames_get_bad_request_and_homingd_keeps_serving() {
    let Some(cluster) = start_or_skip("wire_garbage", ClusterOptions::default()).await else {
        return;
    };
    bounded(async {
        let iad = dc("iad");
        let peer = cluster.peer(&iad);
        // Random UDP bytes at the QUIC port (deterministic xorshift noise).
        let noise = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for size in [1usize, 7, 64, 1200, 1452, 9000] {
            for _ in 0..100 {
                let datagram: Vec<u8> = (0..size)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        state as u8
                    })
                    .collect();
                let _ = noise.send_to(&datagram, peer.addr);
            }
        }
        let raw = raw_connect(&router_tls(&cluster), &peer).await;
        // A truncated frame: half of a valid Acquire.
        let whole = wire::encode(&acquire("truncated", "10.0.0.1:1")).unwrap();
        let reply = raw_exchange(&raw, &whole[..whole.len() / 2]).await;
        assert!(bad_request(&reply).is_some(), "{reply:?}");
        // A valid message with trailing bytes.
        let mut trailing = resolve_frame(b"", b"room");
        trailing.extend_from_slice(&[0, 0, 0]);
        assert!(bad_request(&raw_exchange(&raw, &trailing).await).is_some());
        // A length prefix that promises more bytes than the frame holds.
        let lying = [0u8, 0, 0xff, 0x01, b'a'];
        assert!(bad_request(&raw_exchange(&raw, &lying).await).is_some());
        // An unknown request variant.
        assert!(bad_request(&raw_exchange(&raw, &[0x7f, 0, 0]).await).is_some());
        // A frame over 64 KiB: refused once the limit is passed, not buffered.
        let (mut send, mut recv) = raw.open_bi().await.unwrap();
        let writer = tokio::spawn(async move {
            let huge = resolve_frame(b"", &vec![b'a'; 4 * FRAME_BYTES_MAX]);
            send.write_all(&huge).await
        });
        let reply: Reply = wire::decode(&recv.read_to_end(FRAME_BYTES_MAX).await.unwrap()).unwrap();
        let message = bad_request(&reply).unwrap_or_else(|| panic!("{reply:?}"));
        assert!(message.contains("exceeds"), "{message}");
        assert!(
            writer.await.unwrap().is_err(),
            "the server stopped the oversized stream"
        );

        // The same connection, and every other client, are still served.
        assert!(matches!(
            raw_exchange(&raw, &resolve_frame(b"", b"room")).await,
            Reply::Resolved { entry: None, .. }
        ));
        match cluster
            .ask(
                &cluster.host(&iad),
                &iad,
                &acquire("after-garbage", "10.0.0.2:2"),
            )
            .await
        {
            Ok(Reply::Acquire(AcquireReply::Acquired(_))) => {}
            other => panic!("homingd stopped serving: {other:?}"),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_keys_breaking_the_rules_get_bad_request_and_are_never_served() {
    let Some(cluster) = start_or_skip("wire_keys", ClusterOptions::default()).await else {
        return;
    };
    bounded(async {
        let raw = raw_connect(&router_tls(&cluster), &cluster.peer(&dc("iad"))).await;
        let too_long = vec![b'k'; homing_core::key::KEY_NAME_BYTES_MAX + 1];
        let namespace_too_long = vec![b'n'; homing_core::key::NAMESPACE_BYTES_MAX + 1];
        // postcard drops serde's custom messages, so the reply says "malformed
        // frame" rather than naming the rule (see docs/CONSISTENCY.md, findings).
        let cases: [(&str, Vec<u8>); 7] = [
            ("empty name", resolve_frame(b"", b"")),
            ("name too long", resolve_frame(b"", &too_long)),
            ("control character", resolve_frame(b"", b"a\x01b")),
            ("DEL", resolve_frame(b"", b"a\x7f")),
            ("C1 control", resolve_frame(b"", "a\u{85}".as_bytes())),
            ("invalid utf-8", resolve_frame(b"", &[b'a', 0xff, 0xfe])),
            (
                "namespace too long",
                resolve_frame(&namespace_too_long, b"a"),
            ),
        ];
        for (what, frame) in cases {
            let reply = raw_exchange(&raw, &frame).await;
            let message = bad_request(&reply).unwrap_or_else(|| panic!("{what}: {reply:?}"));
            assert!(message.contains("malformed"), "{what}: {message}");
        }
        // The longest valid name is fine.
        let longest = vec![b'k'; homing_core::key::KEY_NAME_BYTES_MAX];
        assert!(matches!(
            raw_exchange(&raw, &resolve_frame(b"", &longest)).await,
            Reply::Resolved { entry: None, .. }
        ));
    })
    .await;
}

// ---------------------------------------------------------------- roles, TLS

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_foreign_ca_certificates_are_rejected_and_roles_only_send_what_they_may() {
    let Some(cluster) = start_or_skip("auth", ClusterOptions::default()).await else {
        return;
    };
    bounded(async {
        let (iad, fra) = (dc("iad"), dc("fra"));
        // A router certificate from another CA: the handshake fails.
        let rogue_ca = DevCa::generate("rogue ca").unwrap();
        let rogue_tls = rogue_ca
            .tls_identity(&Identity::new(Role::Router, None).unwrap())
            .unwrap();
        let rogue = Client::new(&rogue_tls, ClientLimits::default()).unwrap();
        let resolve = Request::Resolve { key: key("room") };
        assert!(cluster.ask(&rogue, &iad, &resolve).await.is_err());
        // A rogue "node iad" answering for iad is refused by a real client too.
        let rogue_node = rogue_ca
            .tls_identity(&Identity::new(Role::Node, Some(iad.clone())).unwrap())
            .unwrap();
        let impostor = Server::bind(
            "127.0.0.1:0".parse().unwrap(),
            &rogue_node,
            iad.clone(),
            ServerLimits::default(),
            Arc::new(FakeFra::new(Mode::Honest)),
        )
        .await
        .unwrap();
        let router = cluster.client(Role::Router, None);
        let to_impostor = Peer {
            addr: impostor.local_addr(),
            dc: iad.clone(),
        };
        assert!(router.request(&to_impostor, &resolve).await.is_err());
        impostor.shutdown().await;

        let unauthorized = |reply: Result<Reply, homing_net::NetError>| match reply {
            Ok(Reply::Error(e)) => e.kind == ErrorKind::Unauthorized,
            _ => false,
        };
        // A router may not link (node only) nor acquire.
        let link = Request::Link {
            key: key("room"),
            from: ReservationId::new(iad.clone(), 1),
            to: ReservationId::new(fra.clone(), 1),
            expected_token: FencingToken::FIRST,
        };
        assert!(unauthorized(cluster.ask(&router, &iad, &link).await));
        assert!(unauthorized(
            cluster
                .ask(&router, &iad, &acquire("room", "10.0.0.1:1"))
                .await
        ));
        // A host of fra may not hold a lease in iad: its connection is
        // refused (a host of another DC has no connection share here), or
        // its request unauthorized.
        let foreign_host = cluster
            .ask(&cluster.host(&fra), &iad, &acquire("room", "10.0.0.1:1"))
            .await;
        let refused = matches!(&foreign_host, Err(homing_net::NetError::Refused { .. }));
        assert!(
            refused || unauthorized(foreign_host),
            "a host of fra was served in iad"
        );
        // A node may only link to its own reservations.
        let fra_node = cluster.client(Role::Node, Some(&fra));
        let foreign_link = Request::Link {
            key: key("room"),
            from: ReservationId::new(iad.clone(), 1),
            to: ReservationId::new(dc("sin"), 1),
            expected_token: FencingToken::FIRST,
        };
        assert!(unauthorized(
            cluster.ask(&fra_node, &iad, &foreign_link).await
        ));
        // A reservation never links to itself: a vacant one asked to (by
        // its own DC's node certificate, with the right token) is refused,
        // not applied (the record's transition asserts it; the handler
        // panicked on it once).
        let host = cluster.host(&iad);
        let Ok(Reply::Acquire(AcquireReply::Acquired(grant))) = cluster
            .ask(&host, &iad, &acquire("self-link", "10.0.0.1:1"))
            .await
        else {
            panic!("acquire at iad");
        };
        let release = Request::Release {
            lease: homing_e2e::cluster::lease_of("10.0.0.1:1"),
            reservation: grant.reservation.clone(),
            token: grant.token,
            outcome: homing_core::RunOutcome::Ok,
        };
        assert!(matches!(
            cluster.ask(&host, &iad, &release).await,
            Ok(Reply::Release(_))
        ));
        let self_link = Request::Link {
            key: key("self-link"),
            from: grant.reservation.clone(),
            to: grant.reservation.clone(),
            expected_token: grant.token,
        };
        let iad_node = cluster.client(Role::Node, Some(&iad));
        assert!(matches!(
            cluster.ask(&iad_node, &iad, &self_link).await,
            Ok(Reply::Error(e)) if e.kind == ErrorKind::BadRequest
        ));
        // And the router is still served.
        assert!(matches!(
            cluster.ask(&router, &iad, &resolve).await,
            Ok(Reply::Resolved { .. })
        ));
    })
    .await;
}

// ---------------------------------------------------------------- malicious peer

/// How the fake `fra` answers `ResolveReservation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The truth: `fra.1` is live.
    Honest,
    /// `fra.1 → fra.2 → fra.1`.
    Cycle,
    /// `fra.1 → sin.2 → sin.3`: speaks for sin's reservations.
    ForeignLink,
    /// `fra.1 → fra.2`, tail `sin.9`: a tail it does not own.
    ForeignTail,
    /// Forty links inside fra: longer than any hop limit allows.
    TooLong,
    /// The truth about `fra.1`, but for another key than the one asked about.
    OtherKey,
    /// Accepts the request and never answers.
    Silent,
    /// Answers with a frame of several megabytes (raw server only).
    Huge,
}

fn fra_id(unique: u64) -> ReservationId {
    ReservationId::new(dc("fra"), unique)
}

/// A link whose token is `from`'s unique number: tokens rise along fra's numbering.
fn link(from: ReservationId, to: ReservationId) -> Link {
    Link {
        token: FencingToken::new(from.unique()),
        from,
        to,
    }
}

const HONEST_ACTOR: &str = "10.0.2.1:4000";

/// What `mode` answers to `request` about `key`'s chain; `None`: no answer at all.
fn answer(mode: Mode, key: &Key, request: &Request) -> Option<Reply> {
    let id = match request {
        // The global entry is the truth in every mode: key → fra.1.
        Request::Resolve { .. } => {
            return Some(Reply::Resolved {
                entry: Some(fra_id(1)),
                segment: None,
            });
        }
        Request::ResolveReservation { id } => id.clone(),
        other => {
            return Some(Reply::Error(homing_core::ErrorReply::new(
                ErrorKind::BadRequest,
                format!("fake fra does not serve {}", other.kind()),
            )));
        }
    };
    let segment = |links, tail| Segment {
        key: key.clone(),
        links,
        tail,
        shortcut: None,
    };
    let honest = Segment {
        key: key.clone(),
        shortcut: None,
        links: vec![],
        tail: Some(TailView {
            id: fra_id(1),
            token: FencingToken::new(50),
            tag: None,
            state: TailState::Active {
                actor: ActorId::new(HONEST_ACTOR).unwrap(),
            },
        }),
    };
    let segment = match mode {
        Mode::Honest if id == fra_id(1) => honest,
        Mode::Honest => {
            return Some(Reply::Error(homing_core::ErrorReply::new(
                ErrorKind::UnknownReservation,
                format!("no reservation {id}"),
            )));
        }
        Mode::OtherKey => Segment {
            key: homing_core::Key::new("not-asked-about".parse().unwrap()),
            ..honest
        },
        Mode::Cycle => segment(
            vec![link(fra_id(1), fra_id(2)), link(fra_id(2), fra_id(1))],
            None,
        ),
        Mode::ForeignLink => segment(
            vec![
                link(fra_id(1), ReservationId::new(dc("sin"), 2)),
                link(
                    ReservationId::new(dc("sin"), 2),
                    ReservationId::new(dc("sin"), 3),
                ),
            ],
            None,
        ),
        Mode::ForeignTail => segment(
            vec![link(fra_id(1), fra_id(2))],
            Some(TailView {
                id: ReservationId::new(dc("sin"), 9),
                ..honest.tail.clone().unwrap()
            }),
        ),
        Mode::TooLong => segment(
            (1..=40).map(|n| link(fra_id(n), fra_id(n + 1))).collect(),
            None,
        ),
        Mode::Silent | Mode::Huge => return None,
    };
    Some(Reply::Reservation(segment))
}

/// A fake `fra` on the real protocol (homing-net `Server`), switchable,
/// answering about one key's chain at a time.
struct FakeFra {
    mode: Mutex<(Mode, Key)>,
}

impl FakeFra {
    fn new(mode: Mode) -> FakeFra {
        FakeFra {
            mode: Mutex::new((mode, key("lied-about"))),
        }
    }

    fn set(&self, mode: Mode) {
        self.mode.lock().unwrap().0 = mode;
    }

    /// From now on answers about `key`'s chain.
    fn about(&self, key: Key) {
        self.mode.lock().unwrap().1 = key;
    }

    fn mode(&self) -> Mode {
        self.mode.lock().unwrap().0
    }

    fn answer(&self, request: &Request) -> Option<Reply> {
        let (mode, key) = self.mode.lock().unwrap().clone();
        answer(mode, &key, request)
    }
}

#[async_trait]
impl Handler for FakeFra {
    async fn handle(&self, _caller: &Identity, request: Request) -> Reply {
        match self.answer(&request) {
            Some(reply) => reply,
            None => std::future::pending().await,
        }
    }
}

/// A fake `fra` on raw quinn, able to send what homing-net never would: a
/// reply frame of several megabytes. Stops when dropped.
struct RawFra {
    addr: SocketAddr,
    fake: Arc<FakeFra>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawFra {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawFra {
    async fn start(tls: &TlsIdentity, mode: Mode) -> RawFra {
        let crypto = QuicServerConfig::try_from(tls.rustls_server_config().unwrap()).unwrap();
        let config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        let endpoint = quinn::Endpoint::server(config, "127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = endpoint.local_addr().unwrap();
        let fake = Arc::new(FakeFra::new(mode));
        let serving = fake.clone();
        let task = tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                let fake = serving.clone();
                tokio::spawn(async move {
                    let Ok(connection) = incoming.await else {
                        return;
                    };
                    while let Ok((mut send, mut recv)) = connection.accept_bi().await {
                        let fake = fake.clone();
                        tokio::spawn(async move {
                            let Ok(bytes) = recv.read_to_end(FRAME_BYTES_MAX).await else {
                                return;
                            };
                            let Ok(request) = wire::decode::<Request>(&bytes) else {
                                return;
                            };
                            let frame = match (fake.mode(), fake.answer(&request)) {
                                (_, Some(reply)) => wire::encode(&reply).unwrap(),
                                (Mode::Huge, None) => vec![0x02; 4 * 1024 * 1024],
                                (_, None) => return std::future::pending().await,
                            };
                            // The receiver stops a huge frame early: that error is expected.
                            let _ = send.write_all(&frame).await;
                            let _ = send.finish();
                            let _ = send.stopped().await;
                        });
                    }
                });
            }
        });
        RawFra { addr, fake, task }
    }
}

fn fra_node_tls(cluster: &Cluster) -> TlsIdentity {
    cluster
        .ca()
        .tls_identity(&Identity::new(Role::Node, Some(dc("fra"))).unwrap())
        .unwrap()
}

fn expected_at_resolver(mode: Mode, error: &ResolveError) -> bool {
    match mode {
        Mode::Cycle | Mode::ForeignLink | Mode::ForeignTail | Mode::OtherKey => {
            matches!(error, ResolveError::Inconsistent(_))
        }
        Mode::TooLong => matches!(error, ResolveError::ChainTooLong(HOP_LIMIT_DEFAULT)),
        Mode::Silent | Mode::Huge => {
            matches!(error, ResolveError::Unavailable { dc, .. } if dc.as_str() == "fra")
        }
        Mode::Honest => false,
    }
}

/// A router resolving through a lying `fra` gets a typed error, then the
/// truth once `fra` is fixed: nothing the lie said was cached.
async fn resolver_survives(cluster: &Cluster, fra_addr: SocketAddr, fake: &FakeFra, mode: Mode) {
    let room = key("lied-about");
    fake.about(room.clone());
    let mut config = ResolverConfig::new(vec![(dc("fra"), fra_addr)]);
    config.hop_timeout_ms = 500;
    let resolver = Resolver::new(cluster.client(Role::Router, None), config);
    fake.set(mode);
    let error = resolver
        .resolve(&room)
        .await
        .expect_err("a lie is not an answer");
    assert!(expected_at_resolver(mode, &error), "{mode:?}: {error:?}");
    fake.set(Mode::Honest);
    // A silent fra is held suspect (not asked) until a probe gets an answer.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while resolver.is_suspect(&dc("fra")) {
        assert!(
            std::time::Instant::now() < deadline,
            "{mode:?}: fra stays suspect"
        );
        sleep_ms(20).await;
    }
    let truth = resolver.resolve(&room).await.unwrap_or_else(|e| {
        panic!("{mode:?}: after the fix the resolver still fails: {e} (a lie was cached)")
    });
    assert_eq!(
        (truth.reservation, truth.actor.as_str(), truth.hops),
        (fra_id(1), HONEST_ACTOR, 0),
        "{mode:?}"
    );
}

/// A real homingd whose peer `fra` lies answers the host with a typed error
/// (never a wrong holder), then the truth once `fra` is fixed.
async fn daemon_survives(cluster: &Cluster, fra_addr: SocketAddr, fake: &FakeFra, modes: &[Mode]) {
    let iad = dc("iad");
    let (daemon, global) = cluster
        .start_lone_daemon(
            &iad,
            vec![(dc("fra"), fra_addr)],
            vec!["--peer-timeout-ms=500".to_string()],
        )
        .await;
    let peer = Peer {
        addr: daemon.addr(),
        dc: iad.clone(),
    };
    let host = cluster.host(&iad);
    for (n, mode) in modes.iter().enumerate() {
        let name = format!("lied-{n}");
        global.set_if_absent(&key(&name), &fra_id(1)).await.unwrap();
        fake.about(key(&name));
        fake.set(*mode);
        let reply = host
            .request(&peer, &acquire_anew(&name, "10.0.1.1:1"))
            .await
            .unwrap();
        let kind = match &reply {
            Reply::Error(e) => e.kind.clone(),
            other => panic!("{mode:?}: homingd answered {other:?}"),
        };
        let expected = match mode {
            Mode::Silent | Mode::Huge => ErrorKind::Unavailable { dc: dc("fra") },
            _ => ErrorKind::Inconsistent,
        };
        assert_eq!(kind, expected, "{mode:?}: {reply:?}");
        fake.set(Mode::Honest);
        // A silent fra is held suspect by homingd (answered Unavailable at
        // once) until its probe gets an answer.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let reply = loop {
            let reply = host
                .request(&peer, &acquire_anew(&name, "10.0.1.1:1"))
                .await
                .unwrap();
            let suspect = matches!(&reply, Reply::Error(e) if e.kind == expected);
            if !(suspect && matches!(mode, Mode::Silent)) {
                break reply;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?}: fra stays suspect"
            );
            sleep_ms(20).await;
        };
        match reply {
            Reply::Acquire(AcquireReply::HeldElsewhere(Holder {
                reservation, actor, ..
            })) => assert_eq!((reservation, actor.as_str()), (fra_id(1), HONEST_ACTOR)),
            other => panic!("{mode:?}: after the fix homingd answered {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_peer_lies_loops_and_silence_give_typed_errors_and_cache_nothing_wrong() {
    let Some(cluster) = start_or_skip("malicious_peer", ClusterOptions::default()).await else {
        return;
    };
    bounded(async {
        let fake = Arc::new(FakeFra::new(Mode::Honest));
        let server = Server::bind(
            "127.0.0.1:0".parse().unwrap(),
            &fra_node_tls(&cluster),
            dc("fra"),
            ServerLimits::default(),
            fake.clone(),
        )
        .await
        .unwrap();
        let modes = [
            Mode::Cycle,
            Mode::ForeignLink,
            Mode::ForeignTail,
            Mode::TooLong,
            Mode::OtherKey,
            Mode::Silent,
        ];
        for mode in modes {
            resolver_survives(&cluster, server.local_addr(), &fake, mode).await;
        }
        daemon_survives(&cluster, server.local_addr(), &fake, &modes).await;
        drop(server);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_peer_a_multi_megabyte_reply_is_refused_as_unavailable_and_caches_nothing() {
    let Some(cluster) = start_or_skip("malicious_peer_huge", ClusterOptions::default()).await
    else {
        return;
    };
    bounded(async {
        let raw = RawFra::start(&fra_node_tls(&cluster), Mode::Huge).await;
        resolver_survives(&cluster, raw.addr, &raw.fake, Mode::Huge).await;
        daemon_survives(&cluster, raw.addr, &raw.fake, &[Mode::Huge]).await;
    })
    .await;
}

// ---------------------------------------------------------------- decoder

fn label() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9-]{0,20}"
}

fn reservation() -> impl Strategy<Value = ReservationId> {
    ("[a-z][a-z0-9-]{0,10}", any::<u64>())
        .prop_map(|(d, unique)| ReservationId::new(DcId::new(d).unwrap(), unique))
}

fn request() -> impl Strategy<Value = Request> {
    // Namespaces are `/`-separated segments, none empty.
    let namespace = "([^/\\p{C}]{1,6}(/[^/\\p{C}]{1,6}){0,2})?";
    let key = (namespace, "\\PC{1,40}").prop_map(|(ns, name)| {
        homing_core::Key::in_namespace(ns.parse().unwrap(), name.parse().unwrap())
    });
    prop_oneof![
        key.clone().prop_map(|key| Request::Resolve { key }),
        reservation().prop_map(|id| Request::ResolveReservation { id }),
        (
            key.clone(),
            proptest::option::of(label()),
            label(),
            any::<u64>()
        )
            .prop_map(|(key, tag, actor, t)| Request::Acquire {
                lease: homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
                config: homing_core::KeyConfig {
                    name: Some(key.name),
                    namespace: key.namespace,
                    tag: tag.map(|t| t.parse().unwrap()),
                },
                actor: ActorId::new(actor).unwrap(),
                host_time: homing_core::HostTime::from_ms(t),
                wait_ms: 0,
            }),
        (reservation(), 1..u64::MAX, any::<u64>()).prop_map(|(reservation, token, t)| {
            Request::Renew {
                lease: homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
                reservation,
                token: FencingToken::new(token),
                host_time: homing_core::HostTime::from_ms(t),
            }
        }),
        (key, reservation(), reservation(), 1..u64::MAX).prop_map(|(key, from, to, token)| {
            Request::Link {
                key,
                from,
                to,
                expected_token: FencingToken::new(token),
            }
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every request a peer can build round-trips, and every strict prefix of
    /// its frame is refused (a truncated frame never decodes to something else).
    #[test]
    fn decoder_requests_round_trip_and_their_truncations_are_refused(request in request()) {
        let frame = wire::encode(&request).unwrap();
        prop_assert_eq!(wire::decode::<Request>(&frame).unwrap(), request);
        for cut in 0..frame.len() {
            prop_assert!(wire::decode::<Request>(&frame[..cut]).is_err());
        }
    }
}
