//! The listening side's bounds, against a router whose DC is never asked:
//! every request here is answered by the router itself (400 `no_key`, 408
//! `body_timeout`), so no homingd runs. A silent connection is closed after
//! the detect timeout; an HTTP/1 request head not complete within the
//! header read timeout closes its connection; a body that trickles is cut with 408; idle HTTP/1
//! and HTTP/2 connections are closed; an HTTP/2 client is told the
//! configured stream, window and header bounds; buffered bodies over all
//! requests stay under their bound; silent connections
//! filling `connections_max` stop locking clients out once detected silent;
//! and connections that never send a request and reconnect at once when
//! closed lock no client out either (each newcomer evicts the oldest).
//! And the DC that never answers costs the first request one timeout, not
//! every request: once it is suspect, 503 `unavailable` comes at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use homing_client::{Resolver, ResolverConfig};
use homing_core::{DcId, Identity, Role};
use homing_edge::{EdgeConfig, EdgeRouter, ServeLimits, Serving};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Each scenario must finish within this, in milliseconds; every bound
/// under test is far shorter, every default it would fall back to longer.
const TEST_MS_MAX: u64 = 20_000;
/// The short bound each scenario sets, in milliseconds.
const SHORT_MS: u64 = 300;
/// A bound longer than any scenario, for the one a scenario must not lean on.
const LONG_MS: u64 = 3 * TEST_MS_MAX;
/// Largest answer a raw client reads, in bytes.
const ANSWER_BYTES_MAX: usize = 64 * 1024;

/// A router resolving through one DC at an address nothing answers on.
async fn router(config: EdgeConfig) -> anyhow::Result<Serving> {
    Ok(router_and_stats(config).await?.1)
}

async fn router_and_stats(config: EdgeConfig) -> anyhow::Result<(EdgeRouter, Serving)> {
    let ca = homing_net::pki::DevCa::generate("limits test")?;
    let tls = ca.tls_identity(&Identity::new(Role::Router, None)?)?;
    let client = homing_net::Client::new(&tls, homing_net::ClientLimits::default())?;
    let nowhere = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?;
    let resolver = Resolver::new(
        client,
        ResolverConfig {
            // A request that gets as far as resolving fails fast: 503 unavailable.
            hop_timeout_ms: SHORT_MS,
            ..ResolverConfig::new(vec![(DcId::new("iad")?, nowhere)])
        },
    );
    let router = EdgeRouter::new(resolver, config);
    let serving = router.spawn(TcpListener::bind("127.0.0.1:0").await?)?;
    Ok((router, serving))
}

fn with_serve(serve: ServeLimits) -> EdgeConfig {
    EdgeConfig {
        serve,
        ..EdgeConfig::default()
    }
}

/// Reads until the server closes the connection; what it sent.
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    while answer.len() < ANSWER_BYTES_MAX {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
    }
    answer
}

/// Sends `request` on a new connection to `addr` and reads until the
/// router closes it, as text.
async fn answer_to_close(addr: std::net::SocketAddr, request: &[u8]) -> std::io::Result<String> {
    let mut client = TcpStream::connect(addr).await?;
    client.write_all(request).await?;
    Ok(String::from_utf8_lossy(&read_to_close(&mut client).await).into_owned())
}

/// Reads one HTTP/1.1 answer with a `Content-Length` body.
async fn read_answer(stream: &mut TcpStream) -> anyhow::Result<String> {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if answer.len() >= end + 4 + length {
                return Ok(text);
            }
        }
        let n = stream.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "closed mid-answer: {text:?}");
        answer.extend_from_slice(&chunk[..n]);
    }
}

async fn bounded(scenario: impl std::future::Future<Output = anyhow::Result<()>>) {
    tokio::time::timeout(Duration::from_millis(TEST_MS_MAX), scenario)
        .await
        .expect("the scenario finishes within TEST_MS_MAX")
        .expect("the scenario runs");
}

const NO_KEY_REQUEST: &[u8] = b"GET / HTTP/1.1\r\nhost: router\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connection_is_closed_after_the_detect_timeout() {
    bounded(async {
        let serving = router(with_serve(ServeLimits {
            detect_timeout_ms: SHORT_MS,
            ..ServeLimits::default()
        }))
        .await?;
        let mut silent = TcpStream::connect(serving.local_addr()).await?;
        assert_eq!(read_to_close(&mut silent).await, b"", "closed, unanswered");
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_at_connections_max_lock_no_client_out_after_the_detect_timeout() {
    bounded(async {
        const CONNECTIONS_MAX: usize = 4;
        let serving = router(with_serve(ServeLimits {
            connections_max: CONNECTIONS_MAX,
            detect_timeout_ms: SHORT_MS,
            ..ServeLimits::default()
        }))
        .await?;
        let addr = serving.local_addr();
        let mut silent = Vec::new();
        for _ in 0..CONNECTIONS_MAX {
            silent.push(TcpStream::connect(addr).await?);
        }
        // Every permit is held until the detect timeout closes them.
        for stream in &mut silent {
            assert_eq!(read_to_close(stream).await, b"");
        }
        let mut client = connect_when_admitted(addr).await?;
        let answer = read_answer(&mut client).await?;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("\"error\":\"no_key\""), "{answer}");
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

/// Connections that never send a whole request (nothing at all, or the
/// start of a head), each reopened as soon as the router closes it, fill
/// `connections_max`; no timeout will close them within the test. A client
/// still gets its request answered: each newcomer takes the place of the
/// oldest connection without a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_without_a_request_that_reconnect_at_once_at_connections_max_lock_no_client_out()
 {
    for first_bytes in [&b""[..], b"GET / HT"] {
        bounded(reconnecting_attackers_lock_no_client_out(first_bytes)).await;
    }
}

async fn reconnecting_attackers_lock_no_client_out(
    first_bytes: &'static [u8],
) -> anyhow::Result<()> {
    const CONNECTIONS_MAX: usize = 4;
    let serving = router(with_serve(ServeLimits {
        connections_max: CONNECTIONS_MAX,
        detect_timeout_ms: LONG_MS,
        header_read_timeout_ms: LONG_MS,
        ..ServeLimits::default()
    }))
    .await?;
    let addr = serving.local_addr();
    let attacking = Arc::new(AtomicBool::new(true));
    let closed = Arc::new(tokio::sync::watch::Sender::new(0u64));
    let mut attackers = tokio::task::JoinSet::new();
    // Twice the cap: some always wait in the accept queue.
    for _ in 0..2 * CONNECTIONS_MAX {
        attackers.spawn(reconnect_at_once(
            addr,
            first_bytes,
            attacking.clone(),
            closed.clone(),
        ));
    }
    let mut open = serving.connections();
    open.wait_for(|open| *open == CONNECTIONS_MAX).await?;
    let mut client = connect_when_admitted(addr).await?;
    let answer = read_answer(&mut client).await?;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("\"error\":\"no_key\""), "{answer}");
    let evicted = serving.connections_evicted();
    assert!(evicted > 0, "attackers made room");
    // An evicted connection is closed, not only uncounted.
    closed
        .subscribe()
        .wait_for(|closed| *closed >= evicted)
        .await?;
    attacking.store(false, Ordering::Relaxed);
    serving.stop(Duration::ZERO).await;
    while attackers.join_next().await.is_some() {}
    Ok(())
}

/// Opens a connection that sends `first_bytes` and then nothing, and opens
/// another as soon as the router closes it (counted in `closed`), until
/// `attacking` is cleared.
async fn reconnect_at_once(
    addr: SocketAddr,
    first_bytes: &[u8],
    attacking: Arc<AtomicBool>,
    closed: Arc<tokio::sync::watch::Sender<u64>>,
) {
    while attacking.load(Ordering::Relaxed) {
        // An error means the router stopped: nothing left to hold.
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            return;
        };
        if stream.write_all(first_bytes).await.is_ok() {
            read_to_close(&mut stream).await;
        }
        closed.send_modify(|closed| *closed += 1);
    }
}

/// A connection that sent [`NO_KEY_REQUEST`] and was not closed unanswered:
/// a closed silent connection frees its permit in its task, an instant
/// after the client sees the close.
async fn connect_when_admitted(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    loop {
        let mut client = TcpStream::connect(addr).await?;
        let mut first = [0u8; 1];
        // Refused: closed on accept (the write or the peek may see a reset).
        if client.write_all(NO_KEY_REQUEST).await.is_ok()
            && client.peek(&mut first).await.is_ok_and(|n| n > 0)
        {
            return Ok(client);
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_that_trickles_past_the_body_read_timeout_is_cut_with_408() {
    bounded(async {
        let serving = router(EdgeConfig {
            body_read_timeout_ms: SHORT_MS,
            ..EdgeConfig::default()
        })
        .await?;
        let mut client = TcpStream::connect(serving.local_addr()).await?;
        let head =
            "POST / HTTP/1.1\r\nhost: router\r\nx-homing-key: slow\r\ncontent-length: 100\r\n\r\n";
        client.write_all(head.as_bytes()).await?;
        client.write_all(b"only ten b").await?;
        let answer = read_answer(&mut client).await?;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(
            answer.ends_with("{\"error\":\"body_timeout\",\"key\":\"slow\"}\n"),
            "{answer}"
        );
        // The rest of that body will never be read: the connection ends.
        assert_eq!(read_to_close(&mut client).await, b"");
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_buffered_over_all_requests_are_bounded_then_answered_503_overloaded() {
    bounded(async {
        const BODIES_BYTES_MAX: usize = 1_000;
        let (router, serving) = router_and_stats(EdgeConfig {
            request_bodies_bytes_max: BODIES_BYTES_MAX,
            ..EdgeConfig::default()
        })
        .await?;
        let post = |length: usize| {
            format!("POST / HTTP/1.1\r\nhost: router\r\nx-homing-key: big\r\ncontent-length: {length}\r\n\r\n")
        };
        // One request holds 600 buffered bytes and waits for the rest.
        let mut holder = TcpStream::connect(serving.local_addr()).await?;
        holder.write_all(post(BODIES_BYTES_MAX).as_bytes()).await?;
        holder.write_all(&[b'a'; 600]).await?;
        while router.stats().body_bytes_buffered < 600 {
            // A condition poll: the router reads the holder's bytes soon.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Another 600 would pass the bound.
        let mut client = TcpStream::connect(serving.local_addr()).await?;
        client.write_all(post(600).as_bytes()).await?;
        client.write_all(&[b'b'; 600]).await?;
        let answer = read_answer(&mut client).await?;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(
            answer.ends_with("{\"error\":\"overloaded\",\"key\":\"big\"}\n"),
            "{answer}"
        );
        assert_eq!(router.stats().body_bytes_buffered, 600, "the refused body is not counted");
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_connection_idle_after_its_answer_is_closed() {
    bounded(async {
        let serving = router(with_serve(ServeLimits {
            idle_timeout_ms: SHORT_MS,
            // Waiting for the next head would close it too; not this test.
            header_read_timeout_ms: LONG_MS,
            ..ServeLimits::default()
        }))
        .await?;
        let mut client = TcpStream::connect(serving.local_addr()).await?;
        client.write_all(NO_KEY_REQUEST).await?;
        let answer = read_answer(&mut client).await?;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert_eq!(read_to_close(&mut client).await, b"", "closed when idle");
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_request_head_not_complete_within_the_header_read_timeout_closes_the_connection() {
    bounded(async {
        let serving = router(with_serve(ServeLimits {
            header_read_timeout_ms: SHORT_MS,
            // Neither the detect nor the idle timeout may be what closes it.
            detect_timeout_ms: LONG_MS,
            idle_timeout_ms: LONG_MS,
            ..ServeLimits::default()
        }))
        .await?;
        // Half a head as the first request (slowloris)…
        let mut slow = TcpStream::connect(serving.local_addr()).await?;
        slow.write_all(b"GET / HTTP/1.1\r\nhost: router\r\n")
            .await?;
        assert_eq!(read_to_close(&mut slow).await, b"", "closed, unanswered");
        // …and half a head after an answered request: the deadline counts
        // from the end of the previous response.
        let mut client = TcpStream::connect(serving.local_addr()).await?;
        client.write_all(NO_KEY_REQUEST).await?;
        let answer = read_answer(&mut client).await?;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        client.write_all(b"GET / HTTP/1.1\r\nho").await?;
        assert_eq!(read_to_close(&mut client).await, b"", "closed, unanswered");
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connection_idle_after_its_answer_is_closed() {
    bounded(async {
        let serving = router(with_serve(ServeLimits {
            idle_timeout_ms: SHORT_MS,
            ..ServeLimits::default()
        }))
        .await?;
        let stream = TcpStream::connect(serving.local_addr()).await?;
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        let connection = tokio::spawn(connection);
        let request = hyper::Request::get(format!("http://{}/", serving.local_addr()))
            .body(Empty::<Bytes>::new())?;
        let response = sender.send_request(request).await?;
        assert_eq!(response.status(), hyper::StatusCode::BAD_REQUEST);
        let body = response.into_body().collect().await?.to_bytes();
        assert_eq!(&body[..], b"{\"error\":\"no_key\"}\n");
        // The server's GOAWAY ends the client's connection task.
        connection.await??;
        assert!(sender.is_closed());
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

/// The HTTP/2 preface and an empty SETTINGS frame.
const H2_CLIENT_START: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// One HTTP/2 frame: type, stream id, payload.
async fn read_frame(stream: &mut TcpStream) -> anyhow::Result<(u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).await?;
    let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; length];
    stream.read_exact(&mut payload).await?;
    Ok((head[3], id, payload))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_client_is_told_the_configured_stream_window_and_header_bounds() {
    bounded(async {
        let limits = ServeLimits {
            h2_streams_max: 7,
            h2_stream_window_bytes: 100_000,
            h2_connection_window_bytes: 300_000,
            h2_header_list_bytes_max: 4_096,
            ..ServeLimits::default()
        };
        let serving = router(with_serve(limits)).await?;
        let mut client = TcpStream::connect(serving.local_addr()).await?;
        client.write_all(H2_CLIENT_START).await?;
        const SETTINGS: u8 = 0x4;
        const WINDOW_UPDATE: u8 = 0x8;
        let mut settings = Vec::new();
        let mut connection_window = None;
        while connection_window.is_none() || settings.is_empty() {
            match read_frame(&mut client).await? {
                (SETTINGS, 0, payload) if !payload.is_empty() => {
                    for entry in payload.chunks_exact(6) {
                        let id = u16::from_be_bytes([entry[0], entry[1]]);
                        let value = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
                        settings.push((id, value));
                    }
                }
                (WINDOW_UPDATE, 0, payload) => {
                    let increment =
                        u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                    // Every connection starts with a 65,535-byte window.
                    connection_window = Some(65_535 + increment);
                }
                _ => {}
            }
        }
        let setting = |id: u16| settings.iter().find(|(i, _)| *i == id).map(|(_, v)| *v);
        assert_eq!(
            setting(0x3),
            Some(7),
            "max concurrent streams: {settings:?}"
        );
        assert_eq!(setting(0x4), Some(100_000), "initial window: {settings:?}");
        assert_eq!(
            setting(0x6),
            Some(4_096),
            "max header list size: {settings:?}"
        );
        assert_eq!(connection_window, Some(300_000));
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

/// The first request waits for the silent DC's timeout; from then on the DC
/// is suspect and every request is refused at once, counted, not waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_dc_costs_the_first_request_one_timeout_and_later_ones_none() {
    bounded(async {
        let (router, serving) = router_and_stats(EdgeConfig::default()).await?;
        let request = b"GET / HTTP/1.1\r\nhost: router\r\nx-homing-key: room\r\n\r\n";
        let mut stream = TcpStream::connect(serving.local_addr()).await?;
        let started = std::time::Instant::now();
        stream.write_all(request).await?;
        let first = read_answer(&mut stream).await?;
        assert!(first.starts_with("HTTP/1.1 503"), "{first}");
        assert!(
            started.elapsed() >= Duration::from_millis(SHORT_MS),
            "waited"
        );
        let stats = router.stats();
        assert_eq!(
            (stats.dcs_suspect, stats.dc_suspicions),
            (1, 1),
            "{stats:?}"
        );
        for _ in 0..10 {
            let started = std::time::Instant::now();
            stream.write_all(request).await?;
            let answer = read_answer(&mut stream).await?;
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
            assert!(answer.contains(r#""error":"unavailable""#), "{answer}");
            // The probe's own timeout is longer; the request does not wait for it.
            assert!(
                started.elapsed() < Duration::from_millis(SHORT_MS),
                "{:?}",
                started.elapsed()
            );
        }
        let stats = router.stats();
        assert_eq!(stats.unavailable_suspect, 10, "{stats:?}");
        assert_eq!(
            stats.dc_suspicions, 1,
            "one transition, however many requests"
        );
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

// The router's own HTTP/1.1 server side: its bounds and its framing.

/// A request head must end within this (hyper's read buffer bound, kept),
/// in bytes; past it the client is answered 431.
const REQUEST_HEAD_BYTES_MAX: usize = 8192 + 4096 * 100;

/// Limits under which only the bound a test is about can end a connection.
fn patient() -> EdgeConfig {
    with_serve(ServeLimits {
        detect_timeout_ms: LONG_MS,
        header_read_timeout_ms: LONG_MS,
        idle_timeout_ms: LONG_MS,
        ..ServeLimits::default()
    })
}

/// Reads `n` answers (each a head and its `Content-Length` body; a 1xx
/// has none) from `stream`, in the order they came.
async fn read_answers(stream: &mut TcpStream, n: usize) -> anyhow::Result<Vec<String>> {
    let mut bytes = Vec::new();
    let mut answers = Vec::new();
    let mut chunk = [0u8; 4096];
    while answers.len() < n {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if bytes.len() >= end + 4 + length {
                answers.push(text[..end + 4 + length].to_string());
                bytes.drain(..end + 4 + length);
                continue;
            }
        }
        let read = stream.read(&mut chunk).await?;
        anyhow::ensure!(read > 0, "closed after {answers:?}, then {text:?}");
        bytes.extend_from_slice(&chunk[..read]);
    }
    anyhow::ensure!(bytes.is_empty(), "more than {n} answers: {bytes:?}");
    Ok(answers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_request_head_that_reaches_the_bound_unended_is_answered_431_and_closed() {
    bounded(async {
        let serving = router(patient()).await?;
        let mut client = TcpStream::connect(serving.local_addr()).await?;
        // Exactly the bound, never ended: all of it is read, none is left
        // unread when the router closes.
        let mut head = b"GET / HTTP/1.1\r\nx-long: ".to_vec();
        head.resize(REQUEST_HEAD_BYTES_MAX, b'a');
        let (mut reader, mut writer) = client.split();
        let (written, answer) =
            tokio::join!(writer.write_all(&head), read_to_close_half(&mut reader));
        written?;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
        assert!(answer.contains("connection: close"), "{answer}");
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

async fn read_to_close_half(stream: &mut tokio::net::tcp::ReadHalf<'_>) -> Vec<u8> {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    while answer.len() < ANSWER_BYTES_MAX {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
    }
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_request_head_with_too_many_headers_or_bad_framing_is_refused_and_closed() {
    bounded(async {
        let serving = router(patient()).await?;
        let many: String = (0..=100).map(|i| format!("x-{i}: 1\r\n")).collect();
        let refused = [
            (format!("GET / HTTP/1.1\r\n{many}\r\n"), "HTTP/1.1 431"),
            (
                "POST / HTTP/1.1\r\nx-homing-key: k\r\ntransfer-encoding: gzip\r\n\r\n".to_string(),
                "HTTP/1.1 400",
            ),
            (
                "POST / HTTP/1.1\r\nx-homing-key: k\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n".to_string(),
                "HTTP/1.1 400",
            ),
            (
                format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(65_535)),
                "HTTP/1.1 414",
            ),
            ("BAD\r\n\r\n".to_string(), "HTTP/1.1 400"),
        ];
        for (request, status) in refused {
            let answer = answer_to_close(serving.local_addr(), request.as_bytes()).await?;
            assert!(answer.starts_with(status), "{status}: {answer}");
        }
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_pipelined_requests_are_answered_in_order_whatever_their_bodies() {
    bounded(async {
        let serving = router(patient()).await?;
        let mut client = TcpStream::connect(serving.local_addr()).await?;
        // All at once: no key; an empty key; a chunked body (read whole,
        // so the next request starts where it ends), its key's DC silent;
        // a length body; and the last asks to close.
        let requests = concat!(
            "GET / HTTP/1.1\r\nhost: router\r\n\r\n",
            "GET / HTTP/1.1\r\nx-homing-key:\r\n\r\n",
            "POST / HTTP/1.1\r\nx-homing-key: k\r\ntransfer-encoding: chunked\r\n\r\n",
            "5;ext\r\nhello\r\n0\r\ntrailer: t\r\n\r\n",
            "PUT / HTTP/1.1\r\nx-homing-key: k2\r\ncontent-length: 3\r\n\r\nabc",
            "GET /x HTTP/1.1\r\nconnection: close\r\n\r\n",
        );
        client.write_all(requests.as_bytes()).await?;
        let answers = read_answers(&mut client, 5).await?;
        let expected = [
            ("HTTP/1.1 400", r#"{"error":"no_key"}"#),
            ("HTTP/1.1 400", r#"{"error":"bad_key"}"#),
            (
                "HTTP/1.1 503",
                r#"{"error":"unavailable","key":"k","dc":"iad"}"#,
            ),
            (
                "HTTP/1.1 503",
                r#"{"error":"unavailable","key":"k2","dc":"iad"}"#,
            ),
            ("HTTP/1.1 400", r#"{"error":"no_key"}"#),
        ];
        for (answer, (status, body)) in answers.iter().zip(expected) {
            assert!(answer.starts_with(status), "{status}: {answer}");
            assert!(answer.contains("\r\ndate: "), "dated: {answer}");
            assert!(answer.ends_with(&format!("{body}\n")), "{body}: {answer}");
        }
        assert!(answers[4].contains("connection: close"), "{}", answers[4]);
        assert_eq!(read_to_close(&mut client).await, b"", "closed as asked");
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_expect_100_continue_is_answered_before_the_body_and_http1_0_is_closed_after() {
    bounded(async {
        let serving = router(patient()).await?;
        let mut client = TcpStream::connect(serving.local_addr()).await?;
        let head = "POST / HTTP/1.1\r\nx-homing-key: k\r\nexpect: 100-continue\r\ncontent-length: 5\r\n\r\n";
        client.write_all(head.as_bytes()).await?;
        let interim = read_answers(&mut client, 1).await?;
        assert_eq!(interim, ["HTTP/1.1 100 Continue\r\n\r\n"]);
        client.write_all(b"hello").await?;
        let answer = read_answers(&mut client, 1).await?;
        assert!(answer[0].starts_with("HTTP/1.1 503"), "{answer:?}");
        // HTTP/1.0 without keep-alive: answered, then closed.
        let answer = answer_to_close(serving.local_addr(), b"GET / HTTP/1.0\r\n\r\n").await?;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

/// The router's own answers to a HEAD request carry their head alone: the
/// client reads no body, so the next answer on the connection follows the
/// head directly (a body there would be read as the next status line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_the_routers_own_answer_to_head_has_no_body_and_the_next_answer_follows() {
    bounded(async {
        let serving = router(patient()).await?;
        let requests = concat!(
            "HEAD / HTTP/1.1\r\nhost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
        );
        let text = answer_to_close(serving.local_addr(), requests.as_bytes()).await?;
        let (head, rest) = text.split_once("\r\n\r\n").expect("a whole head");
        assert!(head.starts_with("HTTP/1.1 400"), "{text}");
        assert!(
            head.contains("content-length: 19"),
            "the length it would have: {head}"
        );
        assert!(
            rest.starts_with("HTTP/1.1 400"),
            "the next answer follows the head: {text}"
        );
        assert_eq!(rest.matches(r#"{"error":"no_key"}"#).count(), 1, "{text}");
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}

/// `100 Continue` only when the body may come: an oversized declared
/// length is answered 413 without it, and an HTTP/1.0 client never gets
/// it (RFC 9110 §10.1.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_no_100_continue_for_an_oversized_body_or_an_http1_0_client() {
    bounded(async {
        let serving = router(patient()).await?;
        let head = "POST / HTTP/1.1\r\nx-homing-key: k\r\nexpect: 100-continue\r\ncontent-length: 99999999\r\n\r\n";
        let answer = answer_to_close(serving.local_addr(), head.as_bytes()).await?;
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(!answer.contains("100 Continue"), "{answer}");
        let head = "POST / HTTP/1.0\r\nx-homing-key: k\r\nexpect: 100-continue\r\ncontent-length: 5\r\n\r\nhello";
        let answer = answer_to_close(serving.local_addr(), head.as_bytes()).await?;
        assert!(!answer.contains("100 Continue"), "{answer}");
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        serving.stop(Duration::ZERO).await;
        Ok(())
    })
    .await;
}
