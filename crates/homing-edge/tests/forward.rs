//! The forward rules, against a scripted actor: a TCP server in this test
//! that answers, hangs, or drops the connection after reading a request,
//! reserved in a real DC under its own address. One unreachable actor costs
//! one report and one retry; a request that may have reached the actor is
//! retried only if idempotent; a silent actor gets 504; the actor sees the
//! identifying headers and no hop-by-hop ones; connections are reused.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use homing_client::{HostClock, SystemClock};
use homing_core::{AcquireReply, ActorId, KeyConfig, KeyName, Reply, Request};
use homing_edge::{EdgeConfig, EdgeRouter, EdgeStats, Serving};
use http_body_util::{BodyExt, Full};
use hyper::{Method, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use support::Net;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Each scenario must finish within this, in milliseconds.
const TEST_MS_MAX: u64 = 30_000;
/// The router's wait for response headers in the timeout scenario, in milliseconds.
const UPSTREAM_TIMEOUT_MS: u64 = 300;
/// Largest request head the scripted actor reads, in bytes.
const HEAD_BYTES_MAX: usize = 16 * 1024;

type Http = Client<HttpConnector, Full<Bytes>>;

/// What the scripted actor does with each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Script {
    /// Answers 200 `ok`, with a hop-by-hop `Keep-Alive` header, and keeps the connection.
    Answer,
    /// Reads the request, then closes the connection without answering.
    DropAfterRead,
    /// Reads the request and never answers.
    Hang,
    /// Answers 200 `hello world` chunked, with a trailer, and keeps the connection.
    Chunked,
    /// Answers 200 `bye` with neither length nor chunking: the body ends at the close.
    UntilClose,
    /// Answers with a head that does not end (1 MiB of headers, then silence).
    EndlessHead,
    /// Answers 200 `ok` as if keeping the connection, then closes it and
    /// reports `closed` on the heads channel (an idle timeout at the actor).
    AnswerThenClose,
}

/// A scripted actor: its address, the request heads it read, its accepts.
struct Scripted {
    addr: SocketAddr,
    heads: mpsc::UnboundedReceiver<String>,
    accepted: Arc<Mutex<usize>>,
}

impl Scripted {
    async fn start(script: Script) -> anyhow::Result<Scripted> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (heads_tx, heads) = mpsc::unbounded_channel();
        let accepted = Arc::new(Mutex::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                *counted.lock().expect("test lock") += 1;
                tokio::spawn(serve(stream, script, heads_tx.clone()));
            }
        });
        Ok(Scripted {
            addr,
            heads,
            accepted,
        })
    }

    fn accepted(&self) -> usize {
        *self.accepted.lock().expect("test lock")
    }

    /// Request heads read so far (without waiting).
    fn heads_so_far(&mut self) -> Vec<String> {
        let mut heads = Vec::new();
        while let Ok(head) = self.heads.try_recv() {
            heads.push(head);
        }
        heads
    }
}

async fn serve(mut stream: TcpStream, script: Script, heads: mpsc::UnboundedSender<String>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = read_head(&mut stream, &mut buf).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let body_len = content_length(&head);
        // The body follows the head; read it all before answering.
        while buf.len() < end + body_len {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..end + body_len);
        let _ = heads.send(head);
        match script {
            Script::Answer => {
                let answer =
                    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=5\r\n\r\nok";
                if stream.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
            Script::Chunked => {
                let answer = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                              5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-trailer: t\r\n\r\n";
                if stream.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
            Script::AnswerThenClose => {
                let answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
                drop(stream);
                let _ = heads.send("closed".into());
                return;
            }
            Script::UntilClose => {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\n\r\nbye").await;
                return;
            }
            Script::EndlessHead => {
                // One header whose value does not end: only the byte bound stops it.
                let filler = [b'a'; 1024];
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nx-filler: ").await;
                for _ in 0..1024 {
                    if stream.write_all(&filler).await.is_err() {
                        return;
                    }
                }
                // Then silence, the connection open: only a bound ends the wait.
                let _ = stream.read(&mut [0u8; 1]).await;
                return;
            }
            Script::DropAfterRead => return,
            Script::Hang => {
                let _ = stream.read(&mut [0u8; 1]).await;
                return;
            }
        }
    }
}

/// Reads until a full head is in `buf`; its length with the blank line.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(at + 4);
        }
        if buf.len() > HEAD_BYTES_MAX {
            return None;
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn content_length(head: &str) -> usize {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The value of header `name` in `head`, if present.
fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

/// Reserves `key` in DC 0 for the actor at `addr`; the reply's reservation and token.
async fn reserve(net: &Net, key: &str, addr: SocketAddr) -> anyhow::Result<(String, u64)> {
    let request = Request::Acquire {
        lease: homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
        config: KeyConfig::named(KeyName::new(key)?),
        actor: ActorId::new(addr.to_string())?,
        host_time: SystemClock.now(),
        wait_ms: 0,
    };
    match net.host_client(0)?.request(&net.peer(0), &request).await? {
        Reply::Acquire(AcquireReply::Acquired(grant)) => {
            Ok((grant.reservation.to_string(), grant.token.get()))
        }
        other => anyhow::bail!("acquire {key}: {other:?}"),
    }
}

/// Two DCs, `key` reserved in the first for the actor at `actor`, and a
/// router with `config` in front.
struct Scene {
    net: Net,
    router: EdgeRouter,
    serving: Serving,
    /// The reservation and token the key was granted.
    grant: (String, u64),
}

impl Scene {
    async fn start(key: &str, actor: SocketAddr, config: EdgeConfig) -> anyhow::Result<Scene> {
        let net = Net::start(&["iad", "fra"]).await?;
        let grant = reserve(&net, key, actor).await?;
        let router = EdgeRouter::new(net.resolver(0, 60_000)?, config);
        let serving = router.spawn(TcpListener::bind("127.0.0.1:0").await?)?;
        Ok(Scene {
            net,
            router,
            serving,
            grant,
        })
    }

    async fn stop(self) {
        self.serving.stop(Duration::ZERO).await;
        self.net.shutdown().await;
    }
}

/// What the router answered.
struct Answer {
    status: StatusCode,
    headers: hyper::HeaderMap,
    body: String,
}

async fn send(
    serving: &Serving,
    method: Method,
    key: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<Answer> {
    let http: Http = Client::builder(TokioExecutor::new()).build_http();
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{}/", serving.local_addr()))
        .header("x-homing-key", key);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = http.request(request.body(Full::new(Bytes::new()))?).await?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn diff(after: EdgeStats, before: EdgeStats) -> (u64, u64) {
    (
        after.retries - before.retries,
        after.resolved_by_walk - before.resolved_by_walk,
    )
}

async fn bounded(scenario: impl std::future::Future<Output = anyhow::Result<()>>) {
    tokio::time::timeout(Duration::from_millis(TEST_MS_MAX), scenario)
        .await
        .expect("the scenario finishes within TEST_MS_MAX")
        .expect("the scenario runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_actor_is_reported_re_resolved_and_retried_once_then_502() {
    bounded(async {
        // An address nothing listens on.
        let gone = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let scene = Scene::start("gone", gone, EdgeConfig::default()).await?;
        let before = scene.router.stats();
        let Answer { status, body, .. } = send(&scene.serving, Method::POST, "gone", &[]).await?;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
        assert_eq!(body, "{\"error\":\"actor_unreachable\",\"key\":\"gone\"}\n");
        // A connect error means nothing was sent: even a POST is retried,
        // once, on a fresh resolve (the report dropped the cached answer).
        assert_eq!(diff(scene.router.stats(), before), (1, 2));
        scene.stop().await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_the_actor_may_have_received_is_retried_only_if_idempotent() {
    bounded(async {
        let mut actor = Scripted::start(Script::DropAfterRead).await?;
        let scene = Scene::start("flaky", actor.addr, EdgeConfig::default()).await?;

        let before = scene.router.stats();
        let Answer { status, body, .. } = send(&scene.serving, Method::POST, "flaky", &[]).await?;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
        assert_eq!(actor.heads_so_far().len(), 1, "a POST is sent once");
        assert_eq!(diff(scene.router.stats(), before), (0, 1));

        let before = scene.router.stats();
        let Answer { status, body, .. } = send(&scene.serving, Method::GET, "flaky", &[]).await?;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
        assert_eq!(actor.heads_so_far().len(), 2, "a GET is sent again, once");
        assert_eq!(diff(scene.router.stats(), before), (1, 2));
        scene.stop().await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actor_silent_past_the_upstream_timeout_is_answered_504() {
    bounded(async {
        let actor = Scripted::start(Script::Hang).await?;
        let config = EdgeConfig {
            upstream_timeout_ms: UPSTREAM_TIMEOUT_MS,
            ..EdgeConfig::default()
        };
        let scene = Scene::start("silent", actor.addr, config).await?;
        let Answer { status, body, .. } = send(&scene.serving, Method::GET, "silent", &[]).await?;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
        assert_eq!(
            body,
            "{\"error\":\"upstream_timeout\",\"key\":\"silent\"}\n"
        );
        scene.stop().await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actor_sees_identifying_headers_and_no_hop_by_hop_ones_over_one_reused_connection() {
    bounded(async {
        let mut actor = Scripted::start(Script::Answer).await?;
        let scene = Scene::start("room", actor.addr, EdgeConfig::default()).await?;
        let (reservation, token) = scene.grant.clone();
        let hop = [
            ("connection", "x-private"),
            ("x-private", "1"),
            ("te", "trailers"),
            ("x-end-to-end", "kept"),
        ];
        let answer = send(&scene.serving, Method::GET, "room", &hop).await?;
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (StatusCode::OK, "ok")
        );
        // The actor's hop-by-hop header stays between it and the router.
        assert_eq!(answer.headers.get("keep-alive"), None);
        for _ in 0..2 {
            let Answer { status, .. } = send(&scene.serving, Method::GET, "room", &[]).await?;
            assert_eq!(status, StatusCode::OK);
        }
        let heads = actor.heads_so_far();
        assert_eq!(heads.len(), 3);
        let first = &heads[0];
        assert_eq!(header(first, "host"), Some(actor.addr.to_string().as_str()));
        assert_eq!(header(first, "x-homing-dc"), Some("iad"));
        assert_eq!(
            header(first, "x-homing-reservation"),
            Some(reservation.as_str())
        );
        assert_eq!(
            header(first, "x-homing-token"),
            Some(token.to_string().as_str())
        );
        assert_eq!(header(first, "x-end-to-end"), Some("kept"));
        for gone in ["x-private", "te"] {
            assert_eq!(header(first, gone), None, "{gone} forwarded: {first}");
        }
        assert!(
            first.starts_with("GET / HTTP/1.1\r\n"),
            "origin form: {first}"
        );
        // Three requests one after another share one pooled connection.
        assert_eq!(actor.accepted(), 1);
        scene.stop().await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actor_outside_the_default_loopback_networks_is_refused_without_a_connect() {
    bounded(async {
        // TEST-NET-1: a host could register any address as its actor.
        let outside: SocketAddr = "192.0.2.1:80".parse()?;
        let scene = Scene::start("far", outside, EdgeConfig::default()).await?;
        for refused in 1..=2 {
            let Answer { status, body, .. } = send(&scene.serving, Method::GET, "far", &[]).await?;
            assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
            assert_eq!(body, "{\"error\":\"actor_not_allowed\",\"key\":\"far\"}\n");
            let stats = scene.router.stats();
            assert_eq!((stats.actors_not_allowed, stats.retries), (refused, 0));
        }
        scene.stop().await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actor_outside_the_configured_networks_is_never_dialled() {
    bounded(async {
        let actor = Scripted::start(Script::Answer).await?;
        let config = EdgeConfig {
            actor_networks: vec!["10.0.0.0/8".parse()?, "fd00::/8".parse()?],
            ..EdgeConfig::default()
        };
        let scene = Scene::start("local", actor.addr, config).await?;
        let Answer { status, body, .. } = send(&scene.serving, Method::GET, "local", &[]).await?;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
        assert_eq!(
            body,
            "{\"error\":\"actor_not_allowed\",\"key\":\"local\"}\n"
        );
        assert_eq!(actor.accepted(), 0);
        scene.stop().await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_and_close_delimited_answers_reach_the_client_whole_and_only_the_first_keeps_its_connection()
 {
    bounded(async {
        let chunked = Scripted::start(Script::Chunked).await?;
        let scene = Scene::start("chunked", chunked.addr, EdgeConfig::default()).await?;
        for _ in 0..3 {
            let Answer { status, body, .. } =
                send(&scene.serving, Method::GET, "chunked", &[]).await?;
            assert_eq!((status, body.as_str()), (StatusCode::OK, "hello world"));
        }
        assert_eq!(
            chunked.accepted(),
            1,
            "a chunked answer read to its end keeps its connection"
        );
        scene.stop().await;

        let until_close = Scripted::start(Script::UntilClose).await?;
        let scene = Scene::start("closing", until_close.addr, EdgeConfig::default()).await?;
        for _ in 0..2 {
            let Answer { status, body, .. } =
                send(&scene.serving, Method::GET, "closing", &[]).await?;
            assert_eq!((status, body.as_str()), (StatusCode::OK, "bye"));
        }
        assert_eq!(
            until_close.accepted(),
            2,
            "a body ended by the close ends its connection"
        );
        assert_eq!(scene.router.stats().retries, 0);
        scene.stop().await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actor_answer_with_an_endless_head_is_cut_at_the_head_bound_and_answered_502() {
    bounded(async {
        let mut actor = Scripted::start(Script::EndlessHead).await?;
        let scene = Scene::start("chatty", actor.addr, EdgeConfig::default()).await?;
        let before = scene.router.stats();
        let Answer { status, body, .. } = send(&scene.serving, Method::GET, "chatty", &[]).await?;
        // Not a 504 after the upstream timeout (10 s): the router stops
        // reading at the bound, and a GET is retried once, like any forward
        // that broke after it was sent.
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
        assert_eq!(
            body,
            "{\"error\":\"actor_unreachable\",\"key\":\"chatty\"}\n"
        );
        assert_eq!(actor.heads_so_far().len(), 2);
        assert_eq!(diff(scene.router.stats(), before), (1, 2));
        scene.stop().await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_connection_the_actor_closed_is_dropped_and_a_post_goes_on_a_new_one() {
    bounded(async {
        let mut actor = Scripted::start(Script::AnswerThenClose).await?;
        let scene = Scene::start("idle", actor.addr, EdgeConfig::default()).await?;
        let Answer { status, .. } = send(&scene.serving, Method::POST, "idle", &[]).await?;
        assert_eq!(status, StatusCode::OK);
        // The router parked the connection; the actor then closed it.
        for _ in 0..2 {
            actor.heads.recv().await.expect("the actor reports");
        }
        let before = scene.router.stats();
        let Answer { status, body, .. } = send(&scene.serving, Method::POST, "idle", &[]).await?;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(actor.accepted(), 2, "a new connection for the second POST");
        assert_eq!(diff(scene.router.stats(), before), (0, 0), "no retry");
        scene.stop().await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_request_body_reaches_the_actor_with_its_length_and_pipelined_requests_keep_their_order()
 {
    bounded(async {
        let mut actor = Scripted::start(Script::Answer).await?;
        let scene = Scene::start("piped", actor.addr, EdgeConfig::default()).await?;
        let mut client = TcpStream::connect(scene.serving.local_addr()).await?;
        let requests = concat!(
            "POST /first HTTP/1.1\r\nx-homing-key: piped\r\ntransfer-encoding: chunked\r\n\r\n",
            "2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n",
            "GET /second HTTP/1.1\r\nx-homing-key: piped\r\nconnection: close\r\n\r\n",
        );
        client.write_all(requests.as_bytes()).await?;
        let mut answers = Vec::new();
        client.read_to_end(&mut answers).await?;
        let answers = String::from_utf8_lossy(&answers);
        assert_eq!(answers.matches("HTTP/1.1 200 OK").count(), 2, "{answers}");
        assert!(answers.ends_with("ok"), "{answers}");
        let heads = actor.heads_so_far();
        assert_eq!(heads.len(), 2, "{heads:?}");
        assert!(heads[0].starts_with("POST /first HTTP/1.1"), "{}", heads[0]);
        assert_eq!(header(&heads[0], "content-length"), Some("5"));
        assert_eq!(header(&heads[0], "transfer-encoding"), None);
        assert!(heads[1].starts_with("GET /second HTTP/1.1"), "{}", heads[1]);
        assert_eq!(header(&heads[1], "connection"), None);
        assert_eq!(actor.accepted(), 1, "one actor connection for both");
        scene.stop().await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_gets_the_actors_answer_without_hop_by_hop_headers() {
    bounded(async {
        let actor = Scripted::start(Script::Answer).await?;
        let scene = Scene::start("h2", actor.addr, EdgeConfig::default()).await?;
        let http: Http = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http();
        for _ in 0..2 {
            let request = hyper::Request::builder()
                .uri(format!("http://{}/", scene.serving.local_addr()))
                .header("x-homing-key", "h2")
                .body(Full::new(Bytes::new()))?;
            let response = http.request(request).await?;
            assert_eq!(response.version(), hyper::Version::HTTP_2);
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers().get("keep-alive"), None);
            assert_eq!(response.headers().get("content-length").unwrap(), "2");
            let body = response.into_body().collect().await?.to_bytes();
            assert_eq!(&body[..], b"ok");
        }
        assert_eq!(actor.accepted(), 1, "one actor connection for both");
        scene.stop().await;
        Ok(())
    })
    .await;
}
