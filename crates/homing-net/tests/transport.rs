//! End-to-end transport tests on 127.0.0.1: real sockets, real TLS, each
//! bounded by a timeout.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use homing_core::wire::{self, FRAME_BYTES_MAX};
use homing_core::{
    DcId, ErrorKind, FencingToken, Identity, Key, KeyName, LinkReply, Reply, Request, Role,
};
use homing_net::{
    Client, ClientLimits, ConnectionShares, ConnectionStats, DevCa, Handler, NetError, Peer,
    Server, ServerLimits, TlsIdentity,
};
use quinn::crypto::rustls::QuicClientConfig;
use tokio::task::JoinSet;
use tokio::time::timeout;

const TEST_TIMEOUT: Duration = Duration::from_secs(20);

/// Answers Resolve and Drain recognizably after an optional delay, counting calls.
#[derive(Default)]
struct TestHandler {
    delay: Duration,
    started: AtomicUsize,
}

#[async_trait]
impl Handler for TestHandler {
    async fn handle(&self, _caller: &Identity, request: Request) -> Reply {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        match request {
            Request::Resolve { .. } => Reply::Resolved {
                entry: None,
                segment: None,
            },
            Request::Drain { .. } => Reply::Drained,
            Request::Directory => Reply::Directory(Default::default()),
            Request::Link { .. } => Reply::Link(LinkReply::Linked),
            Request::Watch { after, .. } => Reply::Events {
                events: Vec::new(),
                next: after,
            },
            _ => Reply::Error(homing_core::ErrorReply::new(
                ErrorKind::Internal,
                "unexpected in test",
            )),
        }
    }
}

fn iad() -> DcId {
    DcId::new("iad").unwrap()
}

fn tls(ca: &DevCa, role: Role, dc: Option<DcId>) -> TlsIdentity {
    ca.tls_identity(&Identity::new(role, dc).unwrap()).unwrap()
}

fn resolve() -> Request {
    Request::Resolve {
        key: Key::new(KeyName::new("room-42").unwrap()),
    }
}

fn link() -> Request {
    Request::Link {
        key: Key::new(KeyName::new("room-42").unwrap()),
        from: "iad.1".parse().unwrap(),
        to: "fra.1".parse().unwrap(),
        expected_token: FencingToken::FIRST,
    }
}

async fn start(ca: &DevCa, handler: Arc<TestHandler>, limits: ServerLimits) -> (Server, Peer) {
    let node = tls(ca, Role::Node, Some(iad()));
    let server = Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        &node,
        iad(),
        limits,
        handler,
    )
    .await
    .unwrap();
    let peer = Peer {
        addr: server.local_addr(),
        dc: iad(),
    };
    (server, peer)
}

fn client(ca: &DevCa, role: Role) -> Client {
    let dc = role.needs_dc().then(iad);
    Client::new(&tls(ca, role, dc), ClientLimits::default()).unwrap()
}

fn is_resolved(reply: &Reply) -> bool {
    matches!(
        reply,
        Reply::Resolved {
            entry: None,
            segment: None
        }
    )
}

/// A raw quinn connection with `tls`'s settings, optionally another ALPN.
async fn raw_connect(
    tls: &TlsIdentity,
    peer: &Peer,
    alpn: Option<&[u8]>,
) -> Result<quinn::Connection, String> {
    let mut crypto = tls.rustls_client_config().unwrap();
    if let Some(alpn) = alpn {
        crypto.alpn_protocols = vec![alpn.to_vec()];
    }
    let config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(crypto).unwrap()));
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let connecting = endpoint
        .connect_with(config, peer.addr, "iad.node.homing")
        .map_err(|e| e.to_string())?;
    connecting.await.map_err(|e| e.to_string())
}

#[tokio::test]
async fn round_trip_answers_each_request_kind() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let (server, peer) = start(&ca, Arc::default(), ServerLimits::default()).await;
        let router = client(&ca, Role::Router);
        assert!(is_resolved(
            &router.request(&peer, &resolve()).await.unwrap()
        ));
        let admin = client(&ca, Role::Admin);
        let drain = Request::Drain {
            key: Key::new(KeyName::new("k").unwrap()),
        };
        assert_eq!(admin.request(&peer, &drain).await.unwrap(), Reply::Drained);
        assert!(server.shutdown().await);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_requests_on_one_connection_are_all_answered() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let handler = Arc::new(TestHandler {
            delay: Duration::from_millis(50),
            ..TestHandler::default()
        });
        let (server, peer) = start(&ca, handler.clone(), ServerLimits::default()).await;
        let router = client(&ca, Role::Router);
        let mut requests = JoinSet::new();
        for _ in 0..1000 {
            let (router, peer) = (router.clone(), peer.clone());
            requests.spawn(async move { router.request(&peer, &resolve()).await });
        }
        let mut answered = 0;
        while let Some(result) = requests.join_next().await {
            assert!(is_resolved(&result.unwrap().unwrap()));
            answered += 1;
        }
        assert_eq!(answered, 1000);
        assert_eq!(handler.started.load(Ordering::SeqCst), 1000);
        assert_eq!(
            server.open_connections(),
            1,
            "all requests shared one pooled connection"
        );
        assert!(server.shutdown().await);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_rejected() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let (server, peer) = start(&ca, Arc::default(), ServerLimits::default()).await;
        let rogue_ca = DevCa::generate("rogue ca").unwrap();
        let rogue = rogue_ca
            .issue(&Identity::new(Role::Admin, None).unwrap())
            .unwrap();
        // Trusts the real CA (so it accepts the server) but presents a rogue certificate.
        let rogue_tls =
            TlsIdentity::from_pem_strings(ca.cert_pem(), &rogue.cert_pem, &rogue.key_pem).unwrap();
        let rogue_client = Client::new(&rogue_tls, ClientLimits::default()).unwrap();
        let result = rogue_client.request(&peer, &resolve()).await;
        assert!(
            matches!(
                result,
                Err(NetError::Connect { .. } | NetError::Closed { .. })
            ),
            "{result:?}"
        );
        // The legitimate client is unaffected.
        assert!(is_resolved(
            &client(&ca, Role::Router)
                .request(&peer, &resolve())
                .await
                .unwrap()
        ));
        server.shutdown().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_or_dc_is_rejected() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let (server, peer) = start(&ca, Arc::default(), ServerLimits::default()).await;
        let other_ca = DevCa::generate("other ca").unwrap();
        let stranger = client(&other_ca, Role::Router);
        let result = stranger.request(&peer, &resolve()).await;
        assert!(
            matches!(result, Err(NetError::Connect { .. })),
            "{result:?}"
        );
        // The iad node's certificate does not name fra: the server-name check refuses it.
        let router = client(&ca, Role::Router);
        let as_fra = Peer {
            addr: peer.addr,
            dc: DcId::new("fra").unwrap(),
        };
        let result = router.request(&as_fra, &resolve()).await;
        assert!(
            matches!(result, Err(NetError::Connect { .. })),
            "{result:?}"
        );
        server.shutdown().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_router_sending_link_is_unauthorized_and_its_connection_still_serves() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let handler = Arc::new(TestHandler::default());
        let (server, peer) = start(&ca, handler.clone(), ServerLimits::default()).await;
        let router = client(&ca, Role::Router);
        match router.request(&peer, &link()).await.unwrap() {
            Reply::Error(error) => {
                assert_eq!(error.kind, ErrorKind::Unauthorized);
                assert_eq!(error.message, "router may not send link to dc iad");
            }
            other => panic!("expected unauthorized, got {other:?}"),
        }
        assert_eq!(
            handler.started.load(Ordering::SeqCst),
            0,
            "denied requests never reach the handler"
        );
        assert!(is_resolved(
            &router.request(&peer, &resolve()).await.unwrap()
        ));
        assert_eq!(server.open_connections(), 1);
        // A node certificate may link.
        let node = client(&ca, Role::Node);
        assert_eq!(
            node.request(&peer, &link()).await.unwrap(),
            Reply::Link(LinkReply::Linked)
        );
        server.shutdown().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn an_oversized_frame_is_refused_without_buffering_it() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let (server, peer) = start(&ca, Arc::default(), ServerLimits::default()).await;
        let router_tls = tls(&ca, Role::Router, None);
        let raw = raw_connect(&router_tls, &peer, None).await.unwrap();
        // 64 MiB: far beyond the frame limit and the flow-control window, so the
        // write can only complete if the server stops the stream early.
        let (mut send, mut recv) = raw.open_bi().await.unwrap();
        let writer = tokio::spawn(async move {
            let huge = vec![0u8; 64 * 1024 * 1024];
            send.write_all(&huge).await
        });
        let started = tokio::time::Instant::now();
        let reply = recv.read_to_end(FRAME_BYTES_MAX).await.unwrap();
        match wire::decode::<Reply>(&reply).unwrap() {
            Reply::Error(error) => assert_eq!(error.kind, ErrorKind::BadRequest),
            other => panic!("expected bad request, got {other:?}"),
        }
        let stopped = writer.await.unwrap();
        assert!(matches!(stopped, Err(quinn::WriteError::Stopped(code)) if code == homing_net::frame::CODE_FRAME_TOO_LARGE));
        assert!(started.elapsed() < Duration::from_secs(5));
        // The same connection and other clients keep working.
        let (mut send, mut recv) = raw.open_bi().await.unwrap();
        send.write_all(&wire::encode(&resolve()).unwrap()).await.unwrap();
        send.finish().unwrap();
        assert!(is_resolved(&wire::decode(&recv.read_to_end(FRAME_BYTES_MAX).await.unwrap()).unwrap()));
        assert!(is_resolved(&client(&ca, Role::Router).request(&peer, &resolve()).await.unwrap()));
        server.shutdown().await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_datagrams_and_silent_streams_do_not_harm_other_clients() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let limits = ServerLimits {
            request_timeout_ms: 500,
            ..ServerLimits::default()
        };
        let (server, peer) = start(&ca, Arc::default(), limits).await;
        // Random UDP bytes at the server port (deterministic xorshift noise).
        let noise = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for size in [1usize, 20, 100, 1200, 1500] {
            for _ in 0..200 {
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
        // A client that opens streams and never finishes them (one byte, no FIN),
        // plus streams it opens but never writes.
        let router_tls = tls(&ca, Role::Router, None);
        let silent = raw_connect(&router_tls, &peer, None).await.unwrap();
        let mut held = Vec::new();
        for i in 0..200 {
            let (mut send, recv) = silent.open_bi().await.unwrap();
            if i % 2 == 0 {
                send.write_all(&[0]).await.unwrap();
            }
            held.push((send, recv));
        }
        let router = client(&ca, Role::Router);
        for _ in 0..20 {
            let reply = timeout(Duration::from_secs(2), router.request(&peer, &resolve())).await;
            assert!(is_resolved(&reply.expect("answered in time").unwrap()));
        }
        // The silent client's unfinished streams are reset after the request timeout.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let (_, recv) = &mut held[0];
        assert!(recv.read_to_end(FRAME_BYTES_MAX).await.is_err());
        assert!(server.shutdown().await);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_requests_and_refuses_new_connections() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let handler = Arc::new(TestHandler {
            delay: Duration::from_millis(700),
            ..TestHandler::default()
        });
        let (server, peer) = start(&ca, handler.clone(), ServerLimits::default()).await;
        let router = client(&ca, Role::Router);
        let in_flight = {
            let (router, peer) = (router.clone(), peer.clone());
            tokio::spawn(async move { router.request(&peer, &resolve()).await })
        };
        while handler.started.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let shutdown = tokio::spawn(server.shutdown());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let late = Client::new(
            &tls(&ca, Role::Router, None),
            ClientLimits {
                connect_timeout_ms: 500,
                ..ClientLimits::default()
            },
        )
        .unwrap();
        let refused = late.request(&peer, &resolve()).await;
        assert!(
            refused.is_err(),
            "new connection during shutdown: {refused:?}"
        );
        assert!(
            is_resolved(&in_flight.await.unwrap().unwrap()),
            "in-flight request completed"
        );
        assert!(shutdown.await.unwrap(), "drained within the bound");
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_holds_connections_until_their_replies_are_acknowledged() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let handler = Arc::new(TestHandler {
            delay: Duration::from_millis(400),
            ..TestHandler::default()
        });
        let (server, direct) = start(&ca, handler, ServerLimits::default()).await;
        let relay = homing_net::Relay::start("127.0.0.1:0".parse().unwrap(), direct.addr, 11)
            .await
            .unwrap();
        let via = Peer {
            addr: relay.addr(),
            dc: iad(),
        };
        let router = client(&ca, Role::Router);
        router.request(&via, &resolve()).await.unwrap();
        // From here every packet from the server is lost until healed.
        relay.impairment().block_to_client(true);
        let send = |router: Client, via: Peer| {
            tokio::spawn(async move { router.request(&via, &resolve()).await })
        };
        // `before`'s reply is written (and lost) before shutdown begins;
        // `during`'s is written (and lost) while shutdown drains.
        let before = send(router.clone(), via.clone());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let during = send(router.clone(), via.clone());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let shutdown = tokio::spawn(server.shutdown());
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !shutdown.is_finished(),
            "shutdown waits for the acknowledgements"
        );
        relay.impairment().block_to_client(false);
        // QUIC retransmits both replies; the server closes only once they
        // are acknowledged.
        for (name, request) in [("before", before), ("during", during)] {
            let reply = request.await.unwrap();
            assert!(
                reply.as_ref().is_ok_and(is_resolved),
                "reply {name} shutdown: {reply:?}"
            );
        }
        assert!(shutdown.await.unwrap(), "drained within the bound");
    })
    .await
    .unwrap();
}

/// Collects the WARN events of the current thread, formatted as `field=value` pairs.
struct WarnCapture(Arc<std::sync::Mutex<Vec<String>>>);

struct FieldText(String);

impl tracing::field::Visit for FieldText {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl tracing::Subscriber for WarnCapture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut text = FieldText(String::new());
            event.record(&mut text);
            self.0.lock().unwrap().push(text.0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

// Current-thread runtime: the server's tasks run on this thread and log to its capture.
#[tokio::test(flavor = "current_thread")]
async fn an_alpn_mismatch_fails_the_handshake_and_is_logged_as_a_version_mismatch() {
    let warnings = Arc::new(std::sync::Mutex::new(Vec::new()));
    let _capture = tracing::subscriber::set_default(WarnCapture(warnings.clone()));
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let (server, peer) = start(&ca, Arc::default(), ServerLimits::default()).await;
        let router_tls = tls(&ca, Role::Router, None);
        let refused = raw_connect(&router_tls, &peer, Some(b"homing/0")).await;
        let error = refused.expect_err("handshake with homing/0 must fail");
        assert!(
            error.contains("120") || error.to_lowercase().contains("application protocol"),
            "{error}"
        );
        assert!(raw_connect(&router_tls, &peer, None).await.is_ok());
        server.shutdown().await;
        let newest = format!("newest={}", homing_core::wire::PROTOCOL_VERSION);
        let warnings = warnings.lock().unwrap();
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("protocol version mismatch") && w.contains(&newest)),
            "{warnings:?}"
        );
    })
    .await
    .unwrap();
}

/// A process of this release and one of the previous release (which
/// speaks only N−1) talk at N−1, whichever side is the older; a request
/// N−1 does not carry is refused before it is sent, and two processes of
/// this release talk at N.
#[tokio::test]
async fn peers_of_two_releases_talk_at_the_older_version() {
    use homing_core::wire::{PROTOCOL_VERSION, PROTOCOL_VERSION_OLDEST};
    let older = PROTOCOL_VERSION_OLDEST;
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let node = tls(&ca, Role::Node, Some(iad()));
        let router = tls(&ca, Role::Router, None);
        async fn bind(tls: &TlsIdentity) -> Server {
            let handler = Arc::new(TestHandler::default());
            let addr = "127.0.0.1:0".parse().unwrap();
            let limits = ServerLimits::default();
            Server::bind(addr, tls, iad(), limits, handler).await.unwrap()
        }
        let new_server = bind(&node).await;
        let old_server = bind(&node.clone().speaking(older, older)).await;
        let at = |server: &Server| Peer {
            addr: server.local_addr(),
            dc: iad(),
        };
        let new_client = Client::new(&router, ClientLimits::default()).unwrap();
        let old_client =
            Client::new(&router.clone().speaking(older, older), ClientLimits::default()).unwrap();
        for (client, server, version) in [
            (&new_client, &new_server, PROTOCOL_VERSION),
            (&new_client, &old_server, older),
            (&old_client, &new_server, older),
        ] {
            let peer = at(server);
            assert_eq!(client.version(&peer).await.unwrap(), version);
            let reply = client.request(&peer, &resolve()).await.unwrap();
            assert!(is_resolved(&reply), "{reply:?}");
            let directory = client.request(&peer, &Request::Directory).await;
            if version == PROTOCOL_VERSION {
                assert_eq!(directory.unwrap(), Reply::Directory(Default::default()));
            } else {
                let error = directory.expect_err("the older version has no directory");
                assert!(
                    matches!(error, NetError::NotSpoken { needs: 8, speaks, .. } if speaks == older),
                    "{error}"
                );
            }
        }
        new_server.shutdown().await;
        old_server.shutdown().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_failing_peer_is_connected_once_then_backed_off() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        // A bound UDP socket that never answers.
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let peer = Peer {
            addr: silent.local_addr().unwrap(),
            dc: iad(),
        };
        let limits = ClientLimits {
            connect_timeout_ms: 300,
            backoff_base_ms: 2_000,
            ..ClientLimits::default()
        };
        let router = Client::new(&tls(&ca, Role::Router, None), limits).unwrap();
        let mut requests = JoinSet::new();
        for _ in 0..10 {
            let (router, peer) = (router.clone(), peer.clone());
            requests.spawn(async move { router.request(&peer, &resolve()).await });
        }
        let (mut connects, mut backoffs) = (0, 0);
        while let Some(result) = requests.join_next().await {
            match result.unwrap() {
                Err(NetError::Connect { .. }) => connects += 1,
                Err(NetError::Backoff { .. }) => backoffs += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            (connects, backoffs),
            (1, 9),
            "one shared handshake, the rest backed off"
        );
        assert!(matches!(
            router.request(&peer, &resolve()).await,
            Err(NetError::Backoff { .. })
        ));
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_client_reconnects_after_the_server_restarts() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let (server, peer) = start(&ca, Arc::default(), ServerLimits::default()).await;
        let router = client(&ca, Role::Router);
        assert!(is_resolved(
            &router.request(&peer, &resolve()).await.unwrap()
        ));
        server.shutdown().await;
        let node = tls(&ca, Role::Node, Some(iad()));
        let addr: SocketAddr = peer.addr;
        // The old endpoint's driver releases the port asynchronously.
        let again = loop {
            match Server::bind(
                addr,
                &node,
                iad(),
                ServerLimits::default(),
                Arc::new(TestHandler::default()),
            )
            .await
            {
                Ok(server) => break server,
                Err(NetError::Io(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(error) => panic!("{error}"),
            }
        };
        assert!(is_resolved(
            &router.request(&peer, &resolve()).await.unwrap()
        ));
        again.shutdown().await;
    })
    .await
    .unwrap();
}

/// Waits (bounded by the test's timeout) until `done` holds for the server's stats.
async fn until_stats(server: &Server, done: impl Fn(&ConnectionStats) -> bool) {
    let stats = server.stats();
    while !done(&stats.snapshot()) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Shares small enough to fill in a test: 6 slots, 1 kept for peers, 1 for
/// hosts of iad, at most 3 per certificate.
fn small_shares() -> ServerLimits {
    ServerLimits {
        shares: ConnectionShares {
            connections_max: 6,
            node_connections_reserved: 1,
            host_connections_reserved: 1,
            identity_connections_max: 3,
        },
        ..ServerLimits::default()
    }
}

#[tokio::test]
async fn one_router_certificate_cannot_crowd_out_peers_and_hosts() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let (server, peer) = start(&ca, Arc::default(), small_shares()).await;
        // One router certificate, many processes: each its own client.
        let router_tls = tls(&ca, Role::Router, None);
        let mut routers = Vec::new();
        let refusal = loop {
            let router = Client::new(&router_tls, ClientLimits::default()).unwrap();
            match router.request(&peer, &resolve()).await {
                Ok(reply) => assert!(is_resolved(&reply)),
                Err(error) => break error,
            }
            routers.push(router);
        };
        assert_eq!(routers.len(), 3, "the certificate's share");
        let NetError::Refused { reason, .. } = &refusal else {
            panic!("expected a refusal, got {refusal:?}");
        };
        assert!(
            reason.contains("router") && reason.contains("3 connections per certificate"),
            "{reason}"
        );
        // Another router certificate takes the last unreserved slot; a third is refused.
        let other = client(&ca, Role::Router);
        assert!(is_resolved(&other.request(&peer, &resolve()).await.unwrap()));
        let refused = client(&ca, Role::Admin).request(&peer, &resolve()).await;
        assert!(
            matches!(&refused, Err(NetError::Refused { reason, .. })
                if reason.contains("admin") && reason.contains("not reserved for peers and hosts is full (4 connections)")),
            "{refused:?}"
        );
        // A peer DC and a new host of this DC still connect and are served.
        let node = Client::new(&tls(&ca, Role::Node, Some(DcId::new("fra").unwrap())), ClientLimits::default()).unwrap();
        assert!(is_resolved(&node.request(&peer, &resolve()).await.unwrap()));
        let host = client(&ca, Role::Host);
        let answered = host.request(&peer, &resolve()).await;
        assert!(
            matches!(&answered, Ok(Reply::Error(e)) if e.kind == ErrorKind::Unauthorized),
            "a host may not resolve, but it is answered: {answered:?}"
        );
        // The connections that got in keep serving.
        assert!(is_resolved(&routers[0].request(&peer, &resolve()).await.unwrap()));
        let stats = server.stats().snapshot();
        assert_eq!(stats.open["router"], 4);
        assert_eq!(stats.open["node"], 1);
        assert_eq!(stats.open["host"], 1);
        assert_eq!(stats.refusals[&("router", "identity_share")], 1);
        assert_eq!(stats.refusals[&("admin", "unreserved_share")], 1);
        server.shutdown().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_closed_client_frees_its_slot_at_once_and_the_close_is_counted() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let (server, peer) = start(&ca, Arc::default(), small_shares()).await;
        let router_tls = tls(&ca, Role::Router, None);
        // Far more clients than the certificate's share, one after another:
        // each closes before the next starts, so none is refused.
        for _ in 0..10 {
            let router = Client::new(&router_tls, ClientLimits::default()).unwrap();
            assert!(is_resolved(
                &router.request(&peer, &resolve()).await.unwrap()
            ));
            router.close().await;
            until_stats(&server, |stats| stats.open["router"] == 0).await;
        }
        let stats = server.stats().snapshot();
        assert_eq!(stats.closes["graceful"], 10, "{stats:?}");
        assert!(stats.refusals.is_empty(), "{stats:?}");
        assert_eq!(stats.handshakes, 0);
        server.shutdown().await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_cannot_make_the_server_hold_more_than_its_request_budget() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let budget_bytes: u32 = 256 * 1024;
        let limits = ServerLimits {
            streams_max: 64,
            connection_receive_bytes_max: budget_bytes,
            ..ServerLimits::default()
        };
        let (server, peer) = start(&ca, Arc::default(), limits).await;
        let connection = raw_connect(&tls(&ca, Role::Router, None), &peer, None)
            .await
            .unwrap();
        // 64 streams of one whole-size frame each, sent side by side: 4 MiB
        // in all, 16 times the budget. No frame ends before every stream
        // sent all of its frame but the last byte (or was refused), so the
        // server holds partly read frames until they pass the budget,
        // however fast it reads: some are refused, whatever the machine's
        // load. Each is answered: read whole (and found malformed), or
        // refused as over the budget.
        let all_sent = Arc::new(tokio::sync::Barrier::new(64));
        let mut streams = JoinSet::new();
        for _ in 0..64 {
            let (connection, all_sent) = (connection.clone(), all_sent.clone());
            streams.spawn(async move {
                let (mut send, mut recv) = connection.open_bi().await.unwrap();
                // A refused stream is stopped: its write fails, its reply comes.
                let frame = vec![0xff; FRAME_BYTES_MAX];
                let (head, last) = frame.split_at(FRAME_BYTES_MAX - 1);
                let sent = send.write_all(head).await.is_ok();
                all_sent.wait().await;
                if sent && send.write_all(last).await.is_ok() {
                    let _ = send.finish();
                }
                recv.read_to_end(FRAME_BYTES_MAX).await.unwrap()
            });
        }
        let mut refused = 0;
        while let Some(reply) = streams.join_next().await {
            let reply: Reply = wire::decode(&reply.unwrap()).unwrap();
            match &reply {
                Reply::Error(e) if e.kind == ErrorKind::Overloaded => refused += 1,
                Reply::Error(e) if e.kind == ErrorKind::BadRequest => {}
                other => panic!("{other:?}"),
            }
        }
        let stats = server.stats().snapshot();
        let peak = stats.connection_request_bytes_peak;
        assert!(
            peak <= budget_bytes as usize,
            "one connection made the server hold {peak} bytes of requests, over its budget of {budget_bytes}"
        );
        assert!(peak >= FRAME_BYTES_MAX, "whole frames were held: {peak}");
        assert!(refused > 0, "some frames did not fit the budget");
        assert_eq!(stats.request_bytes_buffered, 0, "all given back");
        server.shutdown().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_reply_slower_than_the_request_timeout_is_a_timeout_error() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let handler = Arc::new(TestHandler {
            delay: Duration::from_millis(1_500),
            ..TestHandler::default()
        });
        let (server, peer) = start(&ca, handler, ServerLimits::default()).await;
        let limits = ClientLimits {
            request_timeout_ms: 200,
            ..ClientLimits::default()
        };
        let impatient = Client::new(&tls(&ca, Role::Admin, None), limits).unwrap();
        let result = impatient.request(&peer, &resolve()).await;
        assert!(
            matches!(
                result,
                Err(NetError::Timeout {
                    timeout_ms: 200,
                    ..
                })
            ),
            "{result:?}"
        );
        server.shutdown().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_parked_request_gets_its_wait_on_top_of_both_request_timeouts() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        // The handler takes 1.5 s, three times both sides' request timeout.
        let handler = Arc::new(TestHandler {
            delay: Duration::from_millis(1_500),
            ..TestHandler::default()
        });
        let server_limits = ServerLimits {
            request_timeout_ms: 500,
            ..ServerLimits::default()
        };
        let (server, peer) = start(&ca, handler, server_limits).await;
        let limits = ClientLimits {
            request_timeout_ms: 500,
            ..ClientLimits::default()
        };
        let client = Client::new(&tls(&ca, Role::Admin, None), limits).unwrap();
        let watch = |wait_ms| Request::Watch {
            scope: homing_core::NamespaceScope::everything(),
            after: 7,
            wait_ms,
        };
        // Asking to wait 2 s: answered after 1.5 s.
        let reply = client.request(&peer, &watch(2_000)).await.unwrap();
        assert!(matches!(reply, Reply::Events { next: 7, .. }), "{reply:?}");
        // Not asking to wait: the 500 ms timeouts apply (the client's, or
        // the server's reset, whichever comes first).
        let result = client.request(&peer, &watch(0)).await;
        assert!(
            matches!(
                result,
                Err(NetError::Timeout { .. } | NetError::Closed { .. })
            ),
            "{result:?}"
        );
        // A wait above the protocol's maximum is capped, not trusted.
        assert_eq!(watch(u32::MAX).wait_ms(), homing_core::wire::WAIT_MS_MAX);
        server.shutdown().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_server_resets_a_request_not_answered_within_its_timeout_plus_wait() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let handler = Arc::new(TestHandler {
            delay: Duration::from_millis(1_000),
            ..TestHandler::default()
        });
        let server_limits = ServerLimits {
            request_timeout_ms: 200,
            ..ServerLimits::default()
        };
        let (server, peer) = start(&ca, handler, server_limits).await;
        // The client would wait 10 s: only the server's deadline can end it.
        let limits = ClientLimits {
            request_timeout_ms: 10_000,
            ..ClientLimits::default()
        };
        let client = Client::new(&tls(&ca, Role::Admin, None), limits).unwrap();
        let started = std::time::Instant::now();
        let result = client.request(&peer, &resolve()).await;
        assert!(matches!(result, Err(NetError::Closed { .. })), "{result:?}");
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(200) && elapsed < Duration::from_millis(900),
            "reset after {elapsed:?}"
        );
        // Asking to wait 2 s moves the server's deadline past the handler's 1 s.
        let watch = Request::Watch {
            scope: homing_core::NamespaceScope::everything(),
            after: 7,
            wait_ms: 2_000,
        };
        let reply = client.request(&peer, &watch).await.unwrap();
        assert!(matches!(reply, Reply::Events { next: 7, .. }), "{reply:?}");
        server.shutdown().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn relay_adds_latency_and_partitions_on_command() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("relay ca").unwrap();
        let (server, direct) = start(
            &ca,
            Arc::new(TestHandler::default()),
            ServerLimits::default(),
        )
        .await;
        let relay = homing_net::Relay::start("127.0.0.1:0".parse().unwrap(), direct.addr, 7)
            .await
            .unwrap();
        relay.impairment().set_one_way_delay_ms(25);
        let via = Peer {
            addr: relay.addr(),
            dc: iad(),
        };
        let router = client(&ca, Role::Router);
        assert!(
            is_resolved(&router.request(&via, &resolve()).await.unwrap()),
            "handshake through the relay"
        );
        let started = std::time::Instant::now();
        assert!(is_resolved(
            &router.request(&via, &resolve()).await.unwrap()
        ));
        let rtt = started.elapsed();
        assert!(
            rtt >= Duration::from_millis(50),
            "one request = one round trip = 2 × 25 ms, got {rtt:?}"
        );

        relay.impairment().partition(true);
        let limits = ClientLimits {
            request_timeout_ms: 300,
            ..ClientLimits::default()
        };
        let cut = Client::new(&tls(&ca, Role::Router, None), limits).unwrap();
        assert!(
            cut.request(&via, &resolve()).await.is_err(),
            "a partitioned peer does not answer"
        );
        relay.impairment().partition(false);
        assert!(
            is_resolved(&router.request(&via, &resolve()).await.unwrap()),
            "healed"
        );
        server.shutdown().await;
    })
    .await
    .expect("test timed out");
}

/// Long enough that nothing a handshake test waits for is closed by it.
const LONG_MS: u64 = 60_000;

/// QUIC Initial packets, each a real client's first datagram for a new
/// connection (its own random connection ID), caught before they reach any
/// server: replayed from a socket that never answers, each starts a
/// handshake at the server that stalls.
fn client_initials(ca: &DevCa, count: usize) -> Vec<Vec<u8>> {
    let catcher = UdpSocket::bind("127.0.0.1:0").unwrap();
    catcher
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let crypto = tls(ca, Role::Router, None).rustls_client_config().unwrap();
    let config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(crypto).unwrap()));
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut initials: Vec<Vec<u8>> = Vec::new();
    let mut connecting = Vec::new();
    while initials.len() < count {
        connecting.push(
            endpoint
                .connect_with(
                    config.clone(),
                    catcher.local_addr().unwrap(),
                    "iad.node.homing",
                )
                .unwrap(),
        );
        let mut datagram = vec![0u8; 1500];
        let (n, _) = catcher.recv_from(&mut datagram).unwrap();
        datagram.truncate(n);
        // A long-header Initial (0b11xx_xxxx with type 00); a retransmit of
        // an earlier one is the same connection: skipped.
        let dcid = |d: &[u8]| d[6..6 + d[5] as usize].to_vec();
        if datagram[0] & 0xf0 == 0xc0 && !initials.iter().any(|i| dcid(i) == dcid(&datagram)) {
            initials.push(datagram);
        }
    }
    initials
}

/// Whether `datagram` is a QUIC v1 Retry packet (long header, type 3).
fn is_retry(datagram: &[u8]) -> bool {
    datagram.first().is_some_and(|b| b & 0xf0 == 0xf0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_stalls_is_abandoned_after_the_handshake_timeout() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let limits = ServerLimits {
            handshake_timeout_ms: 300,
            // Without the handshake timeout, only this would end it.
            idle_timeout_ms: LONG_MS,
            ..ServerLimits::default()
        };
        let (server, peer) = start(&ca, Arc::default(), limits).await;
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        for initial in tokio::task::block_in_place(|| client_initials(&ca, 1)) {
            silent.send_to(&initial, peer.addr).unwrap();
        }
        until_stats(&server, |stats| stats.handshakes == 1).await;
        until_stats(&server, |stats| stats.handshakes == 0).await;
        let stats = server.stats().snapshot();
        assert_eq!(
            stats.handshake_failures.get("timeout"),
            Some(&1),
            "{stats:?}"
        );
        assert!(stats.open.values().all(|&open| open == 0), "{stats:?}");
        // Real callers connect as before.
        let router = client(&ca, Role::Router);
        assert!(is_resolved(
            &router.request(&peer, &resolve()).await.unwrap()
        ));
        server.shutdown().await;
    })
    .await
    .unwrap();
}

/// Stalled handshakes fill half of `handshakes_max`: a new caller must
/// first answer a QUIC Retry, which one replaying Initials never does, and
/// a real client does (and is served).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_half_the_handshake_cap_unproven_callers_get_a_retry_and_real_clients_still_connect() {
    timeout(TEST_TIMEOUT, async {
        const HANDSHAKES_MAX: usize = 4;
        let ca = DevCa::generate("test ca").unwrap();
        let limits = ServerLimits {
            handshakes_max: HANDSHAKES_MAX,
            handshake_timeout_ms: LONG_MS,
            idle_timeout_ms: LONG_MS,
            ..ServerLimits::default()
        };
        let (server, peer) = start(&ca, Arc::default(), limits).await;
        let initials = tokio::task::block_in_place(|| client_initials(&ca, HANDSHAKES_MAX / 2 + 1));
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        for initial in &initials[..HANDSHAKES_MAX / 2] {
            silent.send_to(initial, peer.addr).unwrap();
        }
        until_stats(&server, |stats| stats.handshakes == HANDSHAKES_MAX / 2).await;
        assert_eq!(server.stats().snapshot().retries, 0, "under half: no Retry");
        // One more from an address that never proved itself: a Retry, no handshake.
        let forged = UdpSocket::bind("127.0.0.1:0").unwrap();
        forged
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        forged
            .send_to(&initials[HANDSHAKES_MAX / 2], peer.addr)
            .unwrap();
        let mut answer = vec![0u8; 1500];
        let (n, _) = tokio::task::block_in_place(|| forged.recv_from(&mut answer)).unwrap();
        assert!(
            is_retry(&answer[..n]),
            "a Retry, first byte {:#x}",
            answer[0]
        );
        let stats = server.stats().snapshot();
        assert_eq!(
            (stats.retries, stats.handshakes),
            (1, HANDSHAKES_MAX / 2),
            "{stats:?}"
        );
        // A real client answers its Retry and is served.
        let router = client(&ca, Role::Router);
        assert!(is_resolved(
            &router.request(&peer, &resolve()).await.unwrap()
        ));
        let stats = server.stats().snapshot();
        assert_eq!(
            stats.retries, 2,
            "the real client was retried too: {stats:?}"
        );
        assert_eq!(stats.open["router"], 1, "{stats:?}");
        assert!(
            server.shutdown().await,
            "stalled handshakes do not hold up the shutdown's drain"
        );
    })
    .await
    .unwrap();
}

/// Writes `ca` and the certificate `name` (`cert_pem`) into `dir` as the
/// dev PKI lays them out, for [`homing_net::pki::revoke_dev_certs`].
fn dev_pki_dir(dir: &std::path::Path, ca: &DevCa, name: &str, cert_pem: &str) {
    std::fs::write(dir.join("ca.pem"), ca.cert_pem()).unwrap();
    std::fs::write(dir.join("ca.key"), ca.key_pem()).unwrap();
    std::fs::write(dir.join(format!("{name}.pem")), cert_pem).unwrap();
}

#[tokio::test]
async fn a_revoked_client_certificate_is_refused_at_its_next_connection_once_the_server_reloads() {
    timeout(TEST_TIMEOUT, async {
        let ca = DevCa::generate("test ca").unwrap();
        let node = tls(&ca, Role::Node, Some(iad()));
        let server = Server::bind(
            "127.0.0.1:0".parse().unwrap(),
            &node,
            iad(),
            ServerLimits::default(),
            Arc::new(TestHandler::default()),
        )
        .await
        .unwrap();
        let peer = Peer {
            addr: server.local_addr(),
            dc: iad(),
        };
        let revoked = ca
            .issue(&Identity::new(Role::Router, None).unwrap())
            .unwrap();
        let revoked_tls =
            TlsIdentity::from_pem_strings(ca.cert_pem(), &revoked.cert_pem, &revoked.key_pem)
                .unwrap();
        let open = Client::new(&revoked_tls, ClientLimits::default()).unwrap();
        assert!(is_resolved(&open.request(&peer, &resolve()).await.unwrap()));

        let dir = tempfile::tempdir().unwrap();
        dev_pki_dir(dir.path(), &ca, "router", &revoked.cert_pem);
        let (crl, listed) =
            homing_net::pki::revoke_dev_certs(dir.path(), &["router".to_string()], 1_000).unwrap();
        assert_eq!(listed, 1);
        let crl_pem = std::fs::read(&crl).unwrap();
        // Written, not yet loaded: the host still connects anew.
        let before = Client::new(&revoked_tls, ClientLimits::default()).unwrap();
        assert!(is_resolved(
            &before.request(&peer, &resolve()).await.unwrap()
        ));

        server
            .reload(&node.clone().with_crl_pem("crl.pem", &crl_pem).unwrap())
            .unwrap();
        let next = Client::new(&revoked_tls, ClientLimits::default()).unwrap();
        let refused = next.request(&peer, &resolve()).await;
        assert!(
            matches!(
                refused,
                Err(NetError::Connect { .. } | NetError::Closed { .. })
            ),
            "{refused:?}"
        );
        // Its open connection goes on; certificates not listed (another
        // router's, from the same CA) still connect.
        assert!(is_resolved(&open.request(&peer, &resolve()).await.unwrap()));
        let router = client(&ca, Role::Router);
        assert!(is_resolved(
            &router.request(&peer, &resolve()).await.unwrap()
        ));
        // Revoking another keeps the first listed.
        let admin = ca
            .issue(&Identity::new(Role::Admin, None).unwrap())
            .unwrap();
        std::fs::write(dir.path().join("admin.pem"), &admin.cert_pem).unwrap();
        let (_, listed) =
            homing_net::pki::revoke_dev_certs(dir.path(), &["admin".to_string()], 1_001).unwrap();
        assert_eq!(listed, 2);
        for client in [open, before, next, router] {
            client.close().await;
        }
        server.shutdown().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_rotated_server_certificate_is_used_for_new_connections_while_open_ones_go_on() {
    timeout(TEST_TIMEOUT, async {
        // The rotation replaces the CA too, so which certificate a new
        // connection met shows in whom it can reach.
        let (old_ca, new_ca) = (
            DevCa::generate("old ca").unwrap(),
            DevCa::generate("new ca").unwrap(),
        );
        let (server, peer) = start(&old_ca, Arc::default(), ServerLimits::default()).await;
        let open = client(&old_ca, Role::Router);
        assert!(is_resolved(&open.request(&peer, &resolve()).await.unwrap()));
        let stranger = client(&new_ca, Role::Router);
        assert!(stranger.request(&peer, &resolve()).await.is_err());

        server
            .reload(&tls(&new_ca, Role::Node, Some(iad())))
            .unwrap();
        let renewed = client(&new_ca, Role::Router);
        assert!(is_resolved(
            &renewed.request(&peer, &resolve()).await.unwrap()
        ));
        assert!(is_resolved(&open.request(&peer, &resolve()).await.unwrap()));
        let late = client(&old_ca, Role::Router);
        assert!(late.request(&peer, &resolve()).await.is_err());
        // A client reloads too: the old client, given the new CA's
        // identity, connects anew.
        late.reload(&tls(&new_ca, Role::Router, None)).unwrap();
        assert!(is_resolved(&late.request(&peer, &resolve()).await.unwrap()));
        for client in [open, stranger, renewed, late] {
            client.close().await;
        }
        server.shutdown().await;
    })
    .await
    .unwrap();
}
