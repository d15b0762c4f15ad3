//! What homingd counts, and the HTTP endpoint that shows it: `/metrics` in
//! Prometheus text format and `/healthz`. Hand-rolled over a tokio TCP
//! listener: two fixed GET routes do not earn an HTTP stack.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use homing_store::{Failover, FailoverEvent};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Upper bounds of the latency buckets, in microseconds.
const BUCKETS_US: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 1_000_000,
];
/// Longest HTTP request head the endpoint reads, in bytes.
const HTTP_REQUEST_BYTES_MAX: usize = 4096;
/// How long a scraper may take to send its request, in milliseconds.
const HTTP_READ_TIMEOUT_MS: u64 = 2_000;

#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: [u64; BUCKETS_US.len()],
    count: u64,
    sum_us: u64,
}

impl Histogram {
    fn observe(&mut self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        for (bucket, bound) in self.buckets.iter_mut().zip(BUCKETS_US) {
            if us <= bound {
                *bucket += 1;
            }
        }
        self.count += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        for (count, bound) in self.buckets.iter().zip(BUCKETS_US) {
            let le = bound as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{le}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(
            out,
            "{name}_sum{{{}}} {}",
            labels.trim_end_matches(','),
            self.sum_us as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "{name}_count{{{}}} {}",
            labels.trim_end_matches(','),
            self.count
        );
    }
}

/// The daemon's counters. Cheap to update from any task.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Stores that go around a silent endpoint (etcd), by role (`global`, `dc`).
    failover: Mutex<Vec<(&'static str, Arc<Failover>)>>,
    requests: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    request_seconds: Mutex<BTreeMap<&'static str, Histogram>>,
    store_seconds: Mutex<BTreeMap<&'static str, Histogram>>,
    peer_seconds: Mutex<BTreeMap<String, Histogram>>,
    global_cache_hits: AtomicU64,
    global_cache_misses: AtomicU64,
    active_leases: AtomicU64,
    waiters: Arc<AtomicU64>,
    event_head: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding a metrics lock leaves plain counters: keep counting.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Metrics {
    /// One request of `kind` finished with `outcome` after `elapsed`.
    pub fn request(&self, kind: &'static str, outcome: &'static str, elapsed: Duration) {
        *lock(&self.requests).entry((kind, outcome)).or_default() += 1;
        lock(&self.request_seconds)
            .entry(kind)
            .or_default()
            .observe(elapsed);
    }

    /// One store operation `op` took `elapsed`.
    pub fn store(&self, op: &'static str, elapsed: Duration) {
        lock(&self.store_seconds)
            .entry(op)
            .or_default()
            .observe(elapsed);
    }

    /// Shows `failover` (a store's endpoint health and counters) as the
    /// store of role `store` (`global`, `dc`).
    pub fn watch_failover(&self, store: &'static str, failover: Arc<Failover>) {
        lock(&self.failover).push((store, failover));
    }

    /// One request to peer DC `dc` took `elapsed` (a round trip).
    pub fn peer(&self, dc: &str, elapsed: Duration) {
        let mut peers = lock(&self.peer_seconds);
        match peers.get_mut(dc) {
            Some(h) => h.observe(elapsed),
            None => peers.entry(dc.to_string()).or_default().observe(elapsed),
        }
    }

    /// A global-entry cache lookup hit or missed.
    pub fn global_cache(&self, hit: bool) {
        let counter = if hit {
            &self.global_cache_hits
        } else {
            &self.global_cache_misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Leases active at the last reaper pass.
    pub fn set_active_leases(&self, n: u64) {
        self.active_leases.store(n, Ordering::Relaxed);
    }

    /// The gauge of parked acquirers, kept current by the waiter registry.
    pub fn waiters_gauge(&self) -> Arc<AtomicU64> {
        self.waiters.clone()
    }

    /// The DC's last event sequence number, as of the last reaper pass.
    pub fn set_event_head(&self, seq: u64) {
        self.event_head.store(seq, Ordering::Relaxed);
    }

    /// Requests counted so far with this kind and outcome.
    pub fn requests_total(&self, kind: &str, outcome: &str) -> u64 {
        lock(&self.requests)
            .iter()
            .filter(|((k, o), _)| *k == kind && *o == outcome)
            .map(|(_, n)| n)
            .sum()
    }

    /// Everything, in Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP homing_requests_total Requests served, by kind and outcome.\n# TYPE homing_requests_total counter\n");
        for ((kind, outcome), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                out,
                "homing_requests_total{{kind=\"{kind}\",outcome=\"{outcome}\"}} {n}"
            );
        }
        out.push_str("# HELP homing_request_duration_seconds Time to serve a request.\n# TYPE homing_request_duration_seconds histogram\n");
        for (kind, h) in lock(&self.request_seconds).iter() {
            h.render(
                &mut out,
                "homing_request_duration_seconds",
                &format!("kind=\"{kind}\","),
            );
        }
        out.push_str("# HELP homing_store_duration_seconds Time of one store operation.\n# TYPE homing_store_duration_seconds histogram\n");
        for (op, h) in lock(&self.store_seconds).iter() {
            h.render(
                &mut out,
                "homing_store_duration_seconds",
                &format!("op=\"{op}\","),
            );
        }
        self.render_failover(&mut out);
        out.push_str("# HELP homing_peer_rtt_seconds Round trip of one request to a peer DC.\n# TYPE homing_peer_rtt_seconds histogram\n");
        for (dc, h) in lock(&self.peer_seconds).iter() {
            h.render(
                &mut out,
                "homing_peer_rtt_seconds",
                &format!("dc=\"{dc}\","),
            );
        }
        let _ = writeln!(
            out,
            "# HELP homing_global_cache_hits_total Global entries served from the in-memory cache.\n# TYPE homing_global_cache_hits_total counter\nhoming_global_cache_hits_total {}",
            self.global_cache_hits.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP homing_global_cache_misses_total Global entries read from the store.\n# TYPE homing_global_cache_misses_total counter\nhoming_global_cache_misses_total {}",
            self.global_cache_misses.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP homing_active_leases Leases active in this DC at the last reaper pass.\n# TYPE homing_active_leases gauge\nhoming_active_leases {}",
            self.active_leases.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP homing_waiters Acquirers parked in this DC, waiting for a busy key.\n# TYPE homing_waiters gauge\nhoming_waiters {}",
            self.waiters.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP homing_event_head Sequence number of this DC's last lifecycle event, at the last reaper pass.\n# TYPE homing_event_head gauge\nhoming_event_head {}",
            self.event_head.load(Ordering::Relaxed)
        );
        out
    }

    fn render_failover(&self, out: &mut String) {
        let stores = lock(&self.failover);
        if stores.is_empty() {
            return;
        }
        out.push_str("# HELP homing_store_endpoint_healthy Whether the store sends operations to this endpoint (0: it missed a deadline or failed, and has not answered a probe since).\n# TYPE homing_store_endpoint_healthy gauge\n");
        for (store, failover) in stores.iter() {
            for endpoint in failover.endpoints() {
                let _ = writeln!(
                    out,
                    "homing_store_endpoint_healthy{{store=\"{store}\",endpoint=\"{}\"}} {}",
                    endpoint.endpoint,
                    u8::from(endpoint.healthy())
                );
            }
        }
        let counters = [
            (
                "homing_store_retried_elsewhere_total",
                "Store operations sent to another endpoint after one failed them or missed their deadline.",
                FailoverEvent::RetriedElsewhere,
            ),
            (
                "homing_store_deadlines_missed_total",
                "Store operations an endpoint did not answer within their deadline.",
                FailoverEvent::DeadlineMissed,
            ),
            (
                "homing_store_ambiguous_resolved_total",
                "Writes whose first attempt may have landed, found landed by the retry's re-read and counted as written once.",
                FailoverEvent::AmbiguousResolved,
            ),
        ];
        for (name, help, event) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (store, failover) in stores.iter() {
                let _ = writeln!(out, "{name}{{store=\"{store}\"}} {}", failover.total(event));
            }
        }
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (mut stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint accept failed");
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut head = vec![0u8; HTTP_REQUEST_BYTES_MAX];
            let read = tokio::time::timeout(
                Duration::from_millis(HTTP_READ_TIMEOUT_MS),
                stream.read(&mut head),
            )
            .await;
            let Ok(Ok(n)) = read else { return };
            let line = String::from_utf8_lossy(&head[..n]);
            let path = line.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = match path {
                "/metrics" => ("200 OK", metrics.render()),
                "/healthz" => ("200 OK", "ok\n".to_string()),
                _ => ("404 Not Found", "try /metrics or /healthz\n".to_string()),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

/// Binds the endpoint; the error names the address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("metrics_listen {addr}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_is_prometheus_text() {
        let m = Metrics::default();
        m.request("resolve", "ok", Duration::from_micros(80));
        m.request("resolve", "ok", Duration::from_millis(3));
        m.peer("fra", Duration::from_millis(20));
        m.global_cache(true);
        let text = m.render();
        assert!(
            text.contains("homing_requests_total{kind=\"resolve\",outcome=\"ok\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "homing_request_duration_seconds_bucket{kind=\"resolve\",le=\"0.0001\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("homing_request_duration_seconds_count{kind=\"resolve\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("homing_peer_rtt_seconds_count{dc=\"fra\"} 1"),
            "{text}"
        );
        assert!(text.contains("homing_global_cache_hits_total 1"));
        assert!(!text.contains("homing_store_endpoint_healthy"), "{text}");
    }

    #[test]
    fn a_store_that_fails_over_shows_its_endpoints_and_counters() {
        let m = Metrics::default();
        let endpoints = [
            "http://127.0.0.1:1".to_string(),
            "http://127.0.0.1:2".to_string(),
        ];
        m.watch_failover("global", Arc::new(Failover::new(&endpoints)));
        let text = m.render();
        assert!(
            text.contains(
                "homing_store_endpoint_healthy{store=\"global\",endpoint=\"http://127.0.0.1:2\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("homing_store_ambiguous_resolved_total{store=\"global\"} 0"),
            "{text}"
        );
    }
}
