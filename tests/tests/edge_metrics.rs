//! The edge router's `/metrics`, `/healthz` and `/readyz` on a real
//! `edge-router` process (issue 55 item 3): an `actor-host` holds a key
//! from iad, users' requests go through the router, and the scrapes taken
//! before and after show the counters move — requests forwarded and
//! refused by reason, resolves from cache and by walk, the upstream
//! latency histogram, each DC's suspicion gauge, client connections.

#![cfg(feature = "etcd")]

use std::net::SocketAddr;
use std::time::Duration;

use homing_e2e::cluster::dc;
use homing_e2e::edge::{ActorHostProcess, EdgeRouterProcess, HttpAnswer, http_get};
use homing_e2e::{ClusterOptions, start_or_skip};

/// Upper bound on the scenario, so a hang fails instead of stalling CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one HTTP exchange.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests sent through the router to the actor.
const FORWARDS: u64 = 5;

/// The value of the sample `line` (name and labels) in a scrape, 0 when absent.
fn sample(text: &str, line: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

async fn get(addr: SocketAddr, path: &str) -> HttpAnswer {
    http_get(addr, path, REQUEST_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_router_metrics_move_with_the_requests_it_routes() {
    let Some(cluster) = start_or_skip("edge_metrics", ClusterOptions::default()).await else {
        return;
    };
    let (iad, fra) = (dc("iad"), dc("fra"));
    let scenario = async {
        let _actor = ActorHostProcess::start(&cluster, &iad, "room-m")
            .await
            .expect("the actor host starts");
        let router =
            EdgeRouterProcess::start(&cluster, &[&fra, &iad], &["--metrics-listen=127.0.0.1:0"])
                .await
                .expect("the router starts");
        let metrics = router.metrics.expect("the router serves /metrics");
        assert_eq!(get(metrics, "/healthz").await.status, 200);
        let ready = get(metrics, "/readyz").await;
        assert_eq!((ready.status, ready.body.trim()), (200, "ready"));

        let before = get(metrics, "/metrics").await.body;
        let forwarded = r#"homing_edge_requests_total{outcome="forwarded"}"#;
        assert_eq!(sample(&before, forwarded), 0.0, "{before}");
        for _ in 0..FORWARDS {
            let answer = get(router.addr, "/k/room-m/hello").await;
            assert_eq!(answer.status, 200, "{answer:?}");
        }
        let unknown = get(router.addr, "/k/never-reserved/x").await;
        assert_eq!(unknown.status, 404, "{unknown:?}");

        let after = get(metrics, "/metrics").await.body;
        println!("{after}");
        assert_eq!(sample(&after, forwarded), FORWARDS as f64, "{after}");
        let not_found = r#"homing_edge_requests_total{outcome="not_found"}"#;
        assert_eq!(sample(&after, not_found), 1.0, "{after}");
        let walked = sample(&after, r#"homing_edge_resolves_total{source="walk"}"#);
        let cached = sample(&after, r#"homing_edge_resolves_total{source="cache"}"#);
        assert_eq!(walked + cached, FORWARDS as f64, "{after}");
        assert!(walked >= 1.0 && cached >= 1.0, "a miss, then hits: {after}");
        let upstream = sample(&after, "homing_edge_upstream_duration_seconds_count");
        assert_eq!(upstream, FORWARDS as f64, "{after}");
        for name in ["iad", "fra"] {
            let suspect = format!("homing_edge_dc_suspect{{dc=\"{name}\"}}");
            assert!(
                after.contains(&format!("{suspect} 0")),
                "{suspect}: {after}"
            );
        }
        assert!(after.contains("homing_edge_connections "), "{after}");
        assert!(
            after.trim_end().ends_with("# EOF"),
            "OpenMetrics text: {after}"
        );
    };
    tokio::time::timeout(SCENARIO_TIMEOUT, scenario)
        .await
        .expect("the scenario finished within its bound");
}
