//! End to end: three DCs in this process, an actor host, the edge router in
//! front; the actor moves between DCs while requests keep flowing.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use homing_edge::{ActorHost, EdgeConfig, EdgeRouter};
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use support::Net;
use tokio::net::TcpListener;
use tokio::time::Instant;

/// The whole scenario must finish within this, in milliseconds.
const TEST_MS_MAX: u64 = 30_000;
/// Concurrent request loops sending through the router.
const SENDERS: usize = 4;
/// Requests that must land on each side of the move.
const LANDED_MIN: usize = 20;
/// Request body limit of the router in the errors scenario, in bytes.
const BODY_BYTES_MAX: usize = 4 * 1024;
/// Tail TTL of the router's resolver, in milliseconds.
const TAIL_TTL_MS: u64 = 1_000;

type Http = Client<HttpConnector, Full<Bytes>>;

/// One request through the router, as seen by the sender.
#[derive(Debug)]
struct Sent {
    started: Instant,
    status: StatusCode,
    body: String,
}

async fn get(http: &Http, url: &str, key: Option<&str>) -> anyhow::Result<(StatusCode, String)> {
    send(http, hyper::Method::GET, url, key, Bytes::new()).await
}

async fn send(
    http: &Http,
    method: hyper::Method,
    url: &str,
    key: Option<&str>,
    body: Bytes,
) -> anyhow::Result<(StatusCode, String)> {
    let mut request = hyper::Request::builder().method(method).uri(url);
    if let Some(key) = key {
        request = request.header("x-homing-key", key);
    }
    let response = http.request(request.body(Full::new(body))?).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn landed_on(body: &str, host: &ActorHost) -> bool {
    body.contains(&format!("\"reservation\":\"{}\"", host.reservation()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_between_dcs_every_request_through_the_router_succeeds() {
    tokio::time::timeout(Duration::from_millis(TEST_MS_MAX), move_scenario())
        .await
        .expect("the scenario finishes within TEST_MS_MAX")
        .expect("the scenario runs");
}

async fn move_scenario() -> anyhow::Result<()> {
    let net = Net::start(&["iad", "fra", "sin"]).await?;
    let key = "room-move";
    let a = net.start_host(0, key).await?;
    let router = EdgeRouter::new(net.resolver(2, TAIL_TTL_MS)?, EdgeConfig::default());
    let serving = router.spawn(TcpListener::bind("127.0.0.1:0").await?)?;
    let url = format!("http://{}/", serving.local_addr());
    let http: Http = Client::builder(TokioExecutor::new()).build_http();

    let running = Arc::new(AtomicBool::new(true));
    let mut senders = Vec::new();
    for _ in 0..SENDERS {
        let (http, url, running) = (http.clone(), url.clone(), running.clone());
        senders.push(tokio::spawn(async move {
            let mut sent = Vec::new();
            while running.load(Ordering::Relaxed) {
                let started = Instant::now();
                let (status, body) = get(&http, &url, Some(key)).await?;
                sent.push(Sent {
                    started,
                    status,
                    body,
                });
            }
            anyhow::Ok(sent)
        }));
    }
    // Let traffic land on A, then move the actor: A releases, B recreates.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let a_reservation = a.reservation().clone();
    a.stop().await?;
    let moved_at = Instant::now();
    let b = net.start_host(1, key).await?;
    let b_started = Instant::now();
    tokio::time::sleep(Duration::from_millis(TAIL_TTL_MS + 500)).await;
    running.store(false, Ordering::Relaxed);

    let mut sent = Vec::new();
    for sender in senders {
        sent.extend(sender.await??);
    }
    let failed: Vec<&Sent> = sent.iter().filter(|s| !s.status.is_success()).collect();
    assert!(
        failed.is_empty(),
        "every request succeeds; failed: {failed:?}"
    );
    let on_a = sent
        .iter()
        .filter(|s| {
            s.body
                .contains(&format!("\"reservation\":\"{a_reservation}\""))
        })
        .count();
    let on_b = sent.iter().filter(|s| landed_on(&s.body, &b)).count();
    assert_eq!(on_a + on_b, sent.len(), "every request lands on A or B");
    assert!(
        on_a >= LANDED_MIN,
        "{on_a} requests landed on A before the move"
    );
    assert!(
        on_b >= LANDED_MIN,
        "{on_b} requests landed on B after the move"
    );
    let late_on_a: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.started >= moved_at && !landed_on(&s.body, &b))
        .collect();
    assert!(
        late_on_a.is_empty(),
        "every request sent after A released lands on B: {late_on_a:?}"
    );
    assert_ne!(b.reservation().dc(), a_reservation.dc());
    let stats = router.stats();
    println!(
        "{} requests, {on_a} on A, {on_b} on B; B serving {} ms after A released; router {stats:?}",
        sent.len(),
        (b_started - moved_at).as_millis()
    );

    serving.stop(Duration::ZERO).await;
    b.stop().await?;
    net.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_answers_each_resolve_failure_with_its_status_and_json_reason() {
    tokio::time::timeout(Duration::from_millis(TEST_MS_MAX), errors_scenario())
        .await
        .expect("the scenario finishes within TEST_MS_MAX")
        .expect("the scenario runs");
}

async fn errors_scenario() -> anyhow::Result<()> {
    let net = Net::start(&["iad", "fra", "sin"]).await?;
    let config = EdgeConfig {
        move_wait_ms: 0,
        request_body_bytes_max: BODY_BYTES_MAX,
        ..EdgeConfig::default()
    };
    let router = EdgeRouter::new(net.resolver(2, TAIL_TTL_MS)?, config);
    let serving = router.spawn(TcpListener::bind("127.0.0.1:0").await?)?;
    let base = format!("http://{}", serving.local_addr());
    let http: Http = Client::builder(TokioExecutor::new()).build_http();

    let (status, body) = get(&http, &format!("{base}/"), None).await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body, "{\"error\":\"no_key\"}\n");

    let (status, body) = get(&http, &format!("{base}/k/never-reserved/x"), None).await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body,
        "{\"error\":\"not_found\",\"key\":\"never-reserved\"}\n"
    );

    // The path prefix routes too, and the actor sees the rest of the path.
    let host = net.start_host(0, "room-gone").await?;
    let (status, body) = get(&http, &format!("{base}/k/room-gone/a"), None).await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(landed_on(&body, &host), "{body}");

    // Released and not recreated: the tail is vacant.
    host.stop().await?;
    let (status, body) = get(&http, &format!("{base}/"), Some("room-gone")).await?;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body, "{\"error\":\"vacant\",\"key\":\"room-gone\"}\n");

    // Bodies are bounded: the limit passes, one byte more is refused.
    let host = net.start_host(1, "room-body").await?;
    let post = |len: usize| {
        let body = Bytes::from(vec![b'x'; len]);
        send(&http, hyper::Method::POST, &base, Some("room-body"), body)
    };
    assert_eq!(post(BODY_BYTES_MAX).await?.0, StatusCode::OK);
    let (status, body) = post(BODY_BYTES_MAX + 1).await?;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(
        body,
        "{\"error\":\"body_too_large\",\"key\":\"room-body\"}\n"
    );
    host.stop().await?;

    // A router whose only DC does not answer: unavailable, naming the DC.
    let dead = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?;
    let resolver = homing_client::Resolver::new(
        net.router_client()?,
        homing_client::ResolverConfig {
            hop_timeout_ms: 300,
            ..homing_client::ResolverConfig::new(vec![(homing_core::DcId::new("iad")?, dead)])
        },
    );
    let cut_off = EdgeRouter::new(resolver, EdgeConfig::default());
    let cut_off = cut_off.spawn(TcpListener::bind("127.0.0.1:0").await?)?;
    let url = format!("http://{}/", cut_off.local_addr());
    let (status, body) = get(&http, &url, Some("room-body")).await?;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(
        body,
        "{\"error\":\"unavailable\",\"key\":\"room-body\",\"dc\":\"iad\"}\n"
    );

    cut_off.stop(Duration::ZERO).await;
    serving.stop(Duration::ZERO).await;
    net.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actor_host_stops_serving_at_its_hard_deadline_once_its_key_is_drained() {
    tokio::time::timeout(Duration::from_millis(TEST_MS_MAX), drain_scenario())
        .await
        .expect("the scenario finishes within TEST_MS_MAX")
        .expect("the scenario runs");
}

async fn drain_scenario() -> anyhow::Result<()> {
    // Leases of 1.5 s: renew at 0.5 s, soft stop at 1 s, hard stop at 1.3 s.
    let net = Net::start_with(&["iad", "fra", "sin"], Some((1_500, 500, 200, 200))).await?;
    let mut host = net.start_host(0, "room-drained").await?;
    let addr = host.local_addr();
    let (status, _) = homing_edge::probe::get(addr, "/", None).await?;
    assert_eq!(status, StatusCode::OK);
    let drain = homing_core::Request::Drain {
        key: host.key().clone(),
    };
    let drained = net.admin_client()?.request(&net.peer(0), &drain).await?;
    assert!(
        matches!(drained, homing_core::Reply::Drained),
        "{drained:?}"
    );
    let started = Instant::now();
    host.terminated().await;
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "stopped by the hard deadline of the last lease granted"
    );
    assert!(
        homing_edge::probe::get(addr, "/", None).await.is_err(),
        "nothing serves after the hard deadline"
    );
    let _ = host.stop().await;
    net.shutdown().await;
    Ok(())
}
