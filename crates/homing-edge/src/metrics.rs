//! What the edge router exports, and the HTTP endpoint that serves it:
//! `/metrics` (OpenMetrics text, encoded by `prometheus-client`), `/healthz`
//! (the process serves) and `/readyz` (it can route: a DC of its table is
//! not suspect). See docs/EDGE-ROUTER.md, "Metrics and health".
//!
//! Counters the request path already keeps (atomics in the router and the
//! Resolver) are read at each scrape into a registry made for that scrape;
//! only the refusals by reason (a slow path) and the upstream latency
//! histogram are kept here. The endpoint is bounded like homingd's: at
//! most [`METRICS_CONNECTIONS_MAX`] connections at once, one request each,
//! each cut off after [`METRICS_CONNECTION_MS_MAX`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use crate::request_counts::Label;
use crate::router::EdgeRouter;

/// Most connections the endpoint serves at once.
pub const METRICS_CONNECTIONS_MAX: usize = 16;
/// How long a scraper may take to send its request head, in milliseconds.
pub const METRICS_HEADER_READ_MS_MAX: u64 = 2_000;
/// Longest life of one connection to the endpoint, in milliseconds.
pub const METRICS_CONNECTION_MS_MAX: u64 = 5_000;
/// Pause after a failed accept before the next, in milliseconds.
const ACCEPT_ERROR_PAUSE_MS: u64 = 100;

/// Where the endpoint reads the client connections open now, if the
/// router serves a listener ([`crate::Serving::connections`]).
pub type Connections = Option<watch::Receiver<usize>>;

/// Everything, in OpenMetrics text: `homing_edge_requests_total` by
/// outcome (`forwarded`, or the reason of the router's own answer),
/// resolves by where the answer came from, the upstream latency, each DC's
/// suspicion, client connections.
pub fn render(router: &EdgeRouter, connections: &Connections) -> String {
    let stats = router.stats();
    let metrics = router.metrics();
    let mut registry = Registry::with_prefix("homing_edge");
    registry.register(
        "requests",
        "Requests answered, by outcome: forwarded (the actor's answer), or the reason the router answered itself (not_found, unavailable, vacant, actor_unreachable, ...)",
        metrics.requests.clone(),
    );
    let resolves: Family<Label, Counter> = Family::default();
    for (source, n) in [
        ("cache", stats.resolved_from_cache),
        ("walk", stats.resolved_by_walk),
    ] {
        resolves.get_or_create(&[("source", source)]).inc_by(n);
    }
    registry.register(
        "resolves",
        "Resolves by where the answer came from: cache (a resolve cache hit) or walk (a miss: round trips to DCs)",
        resolves,
    );
    let counters = [
        (
            "resolves_stale",
            "Remembered answers served, marked stale, while a DC was unavailable (also counted as cache)",
            stats.resolved_stale,
        ),
        (
            "unavailable_suspect",
            "Requests answered 503 unavailable at once because their DC was suspect",
            stats.unavailable_suspect,
        ),
        (
            "dc_suspicions",
            "Times a DC became suspect (a request timed out or could not connect)",
            stats.dc_suspicions,
        ),
        (
            "retries",
            "Forwards retried after the actor was unreachable",
            stats.retries,
        ),
    ];
    for (name, help, value) in counters {
        registry.register(name, help, ConstCounter::new(value));
    }
    registry.register(
        "upstream_duration_seconds",
        "From sending a request to an actor to its response head",
        metrics.upstream_seconds.clone(),
    );
    let suspect: Family<[(&'static str, String); 1], Gauge> = Family::default();
    let resolver = router.resolver();
    for dc in resolver.dcs().iter() {
        let held = i64::from(resolver.is_suspect(dc));
        suspect.get_or_create(&[("dc", dc.to_string())]).set(held);
    }
    registry.register(
        "dc_suspect",
        "1 while the router holds a DC suspect: requests that need it answer 503 at once until a probe gets an answer",
        suspect,
    );
    let gauges = [
        (
            "connections",
            "Client connections open",
            connections.as_ref().map_or(0, |c| *c.borrow()),
        ),
        (
            "body_bytes_buffered",
            "Request body bytes buffered now, over all requests",
            stats.body_bytes_buffered as usize,
        ),
    ];
    for (name, help, value) in gauges {
        let value = i64::try_from(value).unwrap_or(i64::MAX);
        registry.register(name, help, ConstGauge::new(value));
    }
    let mut text = String::new();
    // Writing into a String does not fail.
    let _ = encode(&mut text, &registry);
    text
}

/// Whether the router can route now: some DC of its table is not suspect.
pub fn readiness(router: &EdgeRouter) -> Result<(), String> {
    let resolver = router.resolver();
    let dcs = resolver.dcs();
    if dcs.iter().any(|dc| !resolver.is_suspect(dc)) {
        return Ok(());
    }
    let names: Vec<&str> = dcs.iter().map(|dc| dc.as_str()).collect();
    Err(format!(
        "every DC of the table is suspect ({})",
        names.join(", ")
    ))
}

/// Serves `/metrics`, `/healthz` and `/readyz` of `router` on `listener`
/// in a task, until `stop` turns true.
pub fn spawn(
    listener: TcpListener,
    router: EdgeRouter,
    connections: Connections,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(listen(listener, router, connections, stop))
}

async fn listen(
    listener: TcpListener,
    router: EdgeRouter,
    connections: Connections,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(METRICS_CONNECTIONS_MAX));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(METRICS_HEADER_READ_MS_MAX))
        .keep_alive(false);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return, // never closed
            },
            _ = stop.changed() => return,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, pause_ms = ACCEPT_ERROR_PAUSE_MS, "metrics endpoint accept failed");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let (router, connections) = (router.clone(), connections.clone());
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let answer = respond(request.uri().path(), &router, &connections);
            async move { Ok::<_, Infallible>(answer) }
        });
        let connection = http.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            let limit = Duration::from_millis(METRICS_CONNECTION_MS_MAX);
            let _ = tokio::time::timeout(limit, connection).await;
            drop(permit);
        });
    }
}

/// The answer to a GET of `path`.
fn respond(path: &str, router: &EdgeRouter, connections: &Connections) -> Response<Full<Bytes>> {
    let (status, body, content_type) = match path {
        "/metrics" => (
            StatusCode::OK,
            render(router, connections),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        // Liveness: the process serves.
        "/healthz" => (StatusCode::OK, "ok\n".to_string(), "text/plain"),
        "/readyz" => match readiness(router) {
            Ok(()) => (StatusCode::OK, "ready\n".to_string(), "text/plain"),
            Err(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
                "text/plain",
            ),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "try /metrics, /healthz or /readyz\n".to_string(),
            "text/plain",
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
