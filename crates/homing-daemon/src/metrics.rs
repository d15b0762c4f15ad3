//! What homingd counts, and the HTTP endpoint that shows it: `/metrics` in
//! OpenMetrics text (what Prometheus scrapes), `/healthz` and `/readyz` (and the status page,
//! the `status` module), routed by axum and served with hyper (HTTP/1.1, one
//! request per connection). The exposition is OpenMetrics text encoded by
//! `prometheus-client` (the Prometheus project's Rust client) from a
//! registry made at each scrape out of the counters kept here. The endpoint is bounded: at most
//! [`METRICS_CONNECTIONS_MAX`] connections at once (more wait in the
//! kernel's backlog), each closed after [`METRICS_CONNECTION_MS_MAX`]
//! whatever it does (a silent or never-reading scraper), and a failed accept
//! (out of file descriptors) pauses the loop instead of spinning.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use homing_store::{DcStore, Failover, FailoverEvent, GlobalStore};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Metric, Registry};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// Upper bounds of the latency buckets, in microseconds.
const BUCKETS_US: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 1_000_000,
];
/// Most connections the endpoint serves at once.
pub const METRICS_CONNECTIONS_MAX: usize = 16;
/// How long a scraper may take to send its request head, in milliseconds.
pub const METRICS_HEADER_READ_MS_MAX: u64 = 2_000;
/// Longest life of one connection, from accept to the end of its response
/// (request head, health check, writing): a scraper that stops reading is
/// cut off here.
pub const METRICS_CONNECTION_MS_MAX: u64 = 5_000;
/// How long `/healthz` waits for the stores before it calls them unhealthy.
pub const HEALTH_CHECK_MS_MAX: u64 = 2_000;
/// Pause after a failed accept (e.g. out of file descriptors) before the next.
const ACCEPT_ERROR_PAUSE_MS: u64 = 100;

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

    /// As the encoder wants it: per-bucket counts, `+Inf` last.
    fn snapshot(&self) -> HistogramSnapshot {
        let mut below = 0;
        let mut buckets = Vec::with_capacity(BUCKETS_US.len() + 1);
        for (cumulative, bound_us) in self.buckets.iter().zip(BUCKETS_US) {
            buckets.push((bound_us as f64 / 1e6, cumulative - below));
            below = *cumulative;
        }
        buckets.push((f64::INFINITY, self.count - below));
        HistogramSnapshot {
            sum_s: self.sum_us as f64 / 1e6,
            count: self.count,
            buckets,
        }
    }
}

/// What the etcd compactor did (see `homing_store::etcd::compaction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    /// Compactions etcd accepted.
    pub compactions: u64,
    /// Compactions that failed.
    pub failures: u64,
    /// The revision last compacted to.
    pub revision: i64,
}

/// Reads what the etcd compactor did, at each scrape.
pub struct CompactionSource(pub Box<dyn Fn() -> Compaction + Send + Sync>);

impl std::fmt::Debug for CompactionSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CompactionSource")
            .field(&(self.0)())
            .finish()
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
    /// Per peer DC: held suspect now, and how many suspicions began.
    peer_suspect: Mutex<BTreeMap<String, (bool, u64)>>,
    global_cache_hits: AtomicU64,
    global_cache_misses: AtomicU64,
    active_leases: AtomicU64,
    session_rows: AtomicU64,
    session_keys: AtomicU64,
    /// Whether the DC store counted sessions at all (FoundationDB does not).
    sessions_counted: std::sync::atomic::AtomicBool,
    upkeep_bad_records: AtomicU64,
    upkeep_reaped: AtomicU64,
    /// Host sessions the upkeep ended (their keys reaped, their row deleted).
    sessions_ended: AtomicU64,
    /// Notices listed in session renewal answers (again until acknowledged).
    session_notices_listed: AtomicU64,
    /// `upkeep_reaped` when the last pass ended.
    upkeep_reaped_at_last_pass: AtomicU64,
    acquire_retries: AtomicU64,
    /// Waiters woken by a record read back after another homingd's event.
    log_follow_wakeups: AtomicU64,
    compaction: OnceLock<CompactionSource>,
    waiters: Arc<AtomicU64>,
    watches_parked: Arc<AtomicU64>,
    event_head: AtomicU64,
    /// DC lease renewals acknowledged / failed, and the validity left after the last answer.
    dc_lease_renewals: [AtomicU64; 2],
    dc_lease_valid_ms: AtomicU64,
    connections: OnceLock<homing_net::ServerStats>,
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

    /// Peer `dc` became suspect (`true`) or answers again (`false`).
    pub fn peer_suspect(&self, dc: &str, suspect: bool) {
        let mut peers = lock(&self.peer_suspect);
        let entry = peers.entry(dc.to_string()).or_default();
        entry.0 = suspect;
        if suspect {
            entry.1 += 1;
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

    /// Global-entry reads that went to the global store so far (cache misses).
    pub fn global_reads(&self) -> u64 {
        self.global_cache_misses.load(Ordering::Relaxed)
    }

    /// Session rows and keys as the DC store counted them after a pass.
    pub fn set_sessions(&self, counts: homing_store::SessionCounts) {
        self.session_rows.store(counts.rows, Ordering::Relaxed);
        self.session_keys.store(counts.keys, Ordering::Relaxed);
        self.sessions_counted.store(true, Ordering::Relaxed);
    }

    /// Session rows and keys at the last count (`None`: never counted).
    pub fn sessions(&self) -> Option<homing_store::SessionCounts> {
        self.sessions_counted
            .load(Ordering::Relaxed)
            .then(|| homing_store::SessionCounts {
                rows: self.session_rows.load(Ordering::Relaxed),
                keys: self.session_keys.load(Ordering::Relaxed),
            })
    }

    /// Leases active at the last reaper pass.
    pub fn set_active_leases(&self, n: u64) {
        self.active_leases.store(n, Ordering::Relaxed);
    }

    /// Leases active at the last reaper pass.
    pub fn active_leases(&self) -> u64 {
        self.active_leases.load(Ordering::Relaxed)
    }

    /// QUIC connections holding a slot now, by the caller's role (none
    /// before the server is attached).
    pub fn connections_open(&self) -> Vec<(&'static str, usize)> {
        self.connections
            .get()
            .map(|stats| stats.snapshot().open.into_iter().collect())
            .unwrap_or_default()
    }

    /// Shows what the etcd compactor did, read by `source` at each scrape.
    pub fn watch_compaction(&self, source: CompactionSource) {
        let _ = self.compaction.set(source);
    }

    /// The upkeep reaped a lease.
    pub fn upkeep_reaped(&self) {
        self.upkeep_reaped.fetch_add(1, Ordering::Relaxed);
    }

    /// Leases reaped since the last call (once per pass).
    pub fn upkeep_reaped_since_last_pass(&self) -> u64 {
        let now = self.upkeep_reaped.load(Ordering::Relaxed);
        now.saturating_sub(self.upkeep_reaped_at_last_pass.swap(now, Ordering::Relaxed))
    }

    /// The upkeep ended a host session.
    pub fn session_ended(&self) {
        self.sessions_ended.fetch_add(1, Ordering::Relaxed);
    }

    /// A session renewal's answer listed `n` notices.
    pub fn session_notices_listed(&self, n: usize) {
        self.session_notices_listed
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The upkeep skipped an expiry-index entry whose record could not be read.
    pub fn upkeep_bad_record(&self) {
        self.upkeep_bad_records.fetch_add(1, Ordering::Relaxed);
    }

    /// A host's retried acquire (same key and lease key) joined the one
    /// still running.
    pub fn acquire_retry(&self) {
        self.acquire_retries.fetch_add(1, Ordering::Relaxed);
    }

    /// The event-log follower read a record back and woke `woken` waiters.
    pub fn log_follow_looked(&self, woken: usize) {
        self.log_follow_wakeups
            .fetch_add(woken as u64, Ordering::Relaxed);
    }

    /// Waiters the event-log follower woke, so far.
    pub fn log_follow_wakeups(&self) -> u64 {
        self.log_follow_wakeups.load(Ordering::Relaxed)
    }

    /// Retried acquires that joined, so far.
    pub fn acquire_retries(&self) -> u64 {
        self.acquire_retries.load(Ordering::Relaxed)
    }

    /// The gauge of parked acquirers, kept current by the waiter registry.
    pub fn waiters_gauge(&self) -> Arc<AtomicU64> {
        self.waiters.clone()
    }

    /// The gauge of parked `Watch` requests, kept current by the node.
    pub fn watches_parked_gauge(&self) -> Arc<AtomicU64> {
        self.watches_parked.clone()
    }

    /// A DC lease renewal was acknowledged (`true`) or failed.
    pub fn dc_lease_renewal(&self, acknowledged: bool) {
        self.dc_lease_renewals[usize::from(!acknowledged)].fetch_add(1, Ordering::Relaxed);
    }

    /// How long the DC still counts on its lease, ms, after a renewal's answer.
    pub fn dc_lease_valid_ms(&self, ms: u64) {
        self.dc_lease_valid_ms.store(ms, Ordering::Relaxed);
    }

    /// The DC's last event sequence number, as of the last reaper pass.
    pub fn set_event_head(&self, seq: u64) {
        self.event_head.store(seq, Ordering::Relaxed);
    }

    /// Shows the QUIC server's connection counters too (set once, at start).
    pub fn attach_connections(&self, stats: homing_net::ServerStats) {
        let _ = self.connections.set(stats);
    }

    /// Requests counted so far with this kind and outcome.
    pub fn requests_total(&self, kind: &str, outcome: &str) -> u64 {
        lock(&self.requests)
            .iter()
            .filter(|((k, o), _)| *k == kind && *o == outcome)
            .map(|(_, n)| n)
            .sum()
    }

    /// Everything, in OpenMetrics text (what Prometheus scrapes), encoded
    /// by `prometheus-client` from a registry made for this scrape.
    pub fn render(&self) -> String {
        let mut scrape = Scrape::default();
        let requests = lock(&self.requests);
        scrape.counters(
            "homing_requests_total",
            "Requests served, by kind and outcome.",
            requests
                .iter()
                .map(|((kind, outcome), n)| (labels(&[("kind", kind), ("outcome", outcome)]), *n)),
        );
        drop(requests);
        scrape.histograms(
            "homing_request_duration_seconds",
            "Time to serve a request.",
            lock(&self.request_seconds)
                .iter()
                .map(|(kind, h)| (labels(&[("kind", kind)]), h.snapshot())),
        );
        scrape.histograms(
            "homing_store_duration_seconds",
            "Time of one store operation.",
            lock(&self.store_seconds)
                .iter()
                .map(|(op, h)| (labels(&[("op", op)]), h.snapshot())),
        );
        self.scrape_failover(&mut scrape);
        scrape.histograms(
            "homing_peer_rtt_seconds",
            "Round trip of one request to a peer DC.",
            lock(&self.peer_seconds)
                .iter()
                .map(|(dc, h)| (labels(&[("dc", dc)]), h.snapshot())),
        );
        let suspects = lock(&self.peer_suspect);
        scrape.gauges(
            "homing_peer_suspect",
            "1 while this DC holds a peer suspect: requests that need it answer Unavailable at once until a probe gets an answer.",
            suspects
                .iter()
                .map(|(dc, (suspect, _))| (labels(&[("dc", dc)]), i64::from(*suspect))),
        );
        scrape.counters(
            "homing_peer_suspicions_total",
            "Times a peer became suspect (a request timed out or could not connect).",
            suspects
                .iter()
                .map(|(dc, (_, total))| (labels(&[("dc", dc)]), *total)),
        );
        drop(suspects);
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = [
            (
                "homing_global_cache_hits_total",
                "Global entries served from the in-memory cache.",
                get(&self.global_cache_hits),
            ),
            (
                "homing_global_cache_misses_total",
                "Global entries read from the store.",
                get(&self.global_cache_misses),
            ),
            (
                "homing_acquire_retries_total",
                "Acquires a host sent again (same key and lease key, no answer in time) that joined the one still running here instead of racing it.",
                get(&self.acquire_retries),
            ),
            (
                "homing_log_follow_wakeups_total",
                "Waiters woken because the dc store's event log showed a change (another homingd of this dc wrote it).",
                get(&self.log_follow_wakeups),
            ),
            (
                "homing_upkeep_reaped_total",
                "Leases the upkeep released as expired (per-key leases and host sessions' keys).",
                get(&self.upkeep_reaped),
            ),
            (
                "homing_sessions_ended_total",
                "Host sessions the upkeep ended after their expiry (or close) plus grace: their keys reaped, their row deleted.",
                get(&self.sessions_ended),
            ),
            (
                "homing_session_notices_listed_total",
                "Notices (a drained or force-released session key) listed in host session renewal answers; a notice is listed on every renewal until its host acknowledges it, so a rate well above the drains' means hosts slow to acknowledge.",
                get(&self.session_notices_listed),
            ),
            (
                "homing_upkeep_bad_records_total",
                "Expiry-index entries the upkeep skipped because their record could not be read back (each pass that meets one counts it again).",
                get(&self.upkeep_bad_records),
            ),
        ];
        for (name, help, value) in counters {
            scrape.counter(name, help, value);
        }
        let gauges = [
            (
                "homing_active_leases",
                "Leases active in this DC at the last reaper pass.",
                get(&self.active_leases),
            ),
            (
                "homing_session_rows",
                "Host sessions in this DC's store at the last reaper pass: live ones, and ended ones whose keys are not all reaped yet (redb, etcd; 0 on FoundationDB, which does not count them).",
                get(&self.session_rows),
            ),
            (
                "homing_session_keys",
                "Keys held under host sessions in this DC at the last reaper pass (not in homing_active_leases, which counts per-key leases).",
                get(&self.session_keys),
            ),
            (
                "homing_waiters",
                "Acquirers parked in this DC, waiting for a busy key.",
                get(&self.waiters),
            ),
            (
                "homing_watches_parked",
                "Watch requests parked at this DC, waiting for an event (at most watches_parked_max).",
                get(&self.watches_parked),
            ),
            (
                "homing_event_head",
                "Sequence number of this DC's last lifecycle event, at the last reaper pass.",
                get(&self.event_head),
            ),
        ];
        for (name, help, value) in gauges {
            scrape.gauge(name, help, value);
        }
        scrape.counters(
            "homing_dc_lease_renewals_total",
            "Renewals of this DC's lease in the global store, by outcome.",
            [
                (
                    labels(&[("outcome", "acknowledged")]),
                    get(&self.dc_lease_renewals[0]),
                ),
                (
                    labels(&[("outcome", "failed")]),
                    get(&self.dc_lease_renewals[1]),
                ),
            ],
        );
        let valid_s = get(&self.dc_lease_valid_ms) as f64 / 1000.0;
        scrape.register(
            "homing_dc_lease_valid_seconds",
            "How long this DC still counts on its lease, as of the last renewal's answer (0: it grants no host lease).",
            ConstGauge::new(valid_s),
        );
        if let Some(source) = self.compaction.get() {
            let c = (source.0)();
            scrape.counter(
                "homing_etcd_compactions_total",
                "Compactions of etcd's history by this homingd.",
                c.compactions,
            );
            scrape.counter(
                "homing_etcd_compaction_failures_total",
                "Compactions of etcd's history that failed (tried again next interval).",
                c.failures,
            );
            scrape.register(
                "homing_etcd_compacted_revision",
                "The etcd revision this homingd last compacted to.",
                ConstGauge::new(c.revision),
            );
        }
        if let Some(stats) = self.connections.get() {
            scrape_connections(&mut scrape, &stats.snapshot());
        }
        scrape.finish()
    }

    fn scrape_failover(&self, scrape: &mut Scrape) {
        let stores = lock(&self.failover);
        if stores.is_empty() {
            return;
        }
        let healthy = stores.iter().flat_map(|(store, failover)| {
            failover.endpoints().iter().map(move |endpoint| {
                let labels = labels(&[("store", store), ("endpoint", &endpoint.endpoint)]);
                (labels, i64::from(endpoint.healthy()))
            })
        });
        scrape.gauges(
            "homing_store_endpoint_healthy",
            "Whether the store sends operations to this endpoint (0: it missed a deadline or failed, and has not answered a probe since).",
            healthy.collect::<Vec<_>>(),
        );
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
            scrape.counters(
                name,
                help,
                stores
                    .iter()
                    .map(|(store, failover)| (labels(&[("store", store)]), failover.total(event))),
            );
        }
    }
}

/// The QUIC server's connection counters, into `scrape`.
fn scrape_connections(scrape: &mut Scrape, stats: &homing_net::ConnectionStats) {
    scrape.gauges(
        "homing_connections",
        "Connections holding a slot, by the caller's role.",
        stats
            .open
            .iter()
            .map(|(role, n)| (labels(&[("role", role)]), *n as i64)),
    );
    scrape.gauge(
        "homing_handshakes",
        "TLS handshakes in progress.",
        stats.handshakes as u64,
    );
    scrape.counters(
        "homing_connection_refusals_total",
        "Connections refused, by role (unauthenticated before the handshake) and the share or limit that was full.",
        stats
            .refusals
            .iter()
            .map(|((role, reason), n)| (labels(&[("role", role), ("reason", reason)]), *n)),
    );
    scrape.counters(
        "homing_connection_closes_total",
        "Connections ended, by how: graceful (the caller closed), idle_timeout, error, local.",
        stats
            .closes
            .iter()
            .map(|(kind, n)| (labels(&[("kind", kind)]), *n)),
    );
    scrape.counters(
        "homing_handshake_failures_total",
        "Handshakes that failed, by reason.",
        stats
            .handshake_failures
            .iter()
            .map(|(reason, n)| (labels(&[("reason", reason)]), *n)),
    );
    scrape.counter(
        "homing_handshake_retries_total",
        "QUIC Retry packets sent to make callers prove their address.",
        stats.retries,
    );
    scrape.gauge(
        "homing_request_bytes_buffered",
        "Request bytes held in partly read frames.",
        stats.request_bytes_buffered as u64,
    );
}

/// A label set, in the order given.
type Labels = Vec<(&'static str, String)>;

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// Series of one metric family read at a scrape, each with its labels.
#[derive(Debug)]
struct Series<M> {
    kind: MetricType,
    series: Vec<(Labels, M)>,
}

impl<M: EncodeMetric> EncodeMetric for Series<M> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, metric) in &self.series {
            metric.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        self.kind
    }
}

/// A histogram as read at a scrape: sum, count, and per-bucket counts
/// (not cumulative: the encoder adds them up), ending with `+Inf`.
#[derive(Debug)]
struct HistogramSnapshot {
    sum_s: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl EncodeMetric for HistogramSnapshot {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum_s, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// One scrape's registry: every family registered under its exposed name.
#[derive(Default)]
struct Scrape {
    registry: Registry,
}

impl Scrape {
    /// Registers `metric` as `name`; prometheus-client appends the full stop
    /// to `help` and `_total` to a counter's samples.
    fn register(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.registry
            .register(name, help.trim_end_matches('.'), metric);
    }

    /// A counter family; `name` is the samples' name, ending in `_total`.
    fn counters(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Labels, u64)>,
    ) {
        let family = name.strip_suffix("_total");
        assert!(family.is_some(), "counter {name} ends in _total");
        let series = series.into_iter().map(|(l, n)| (l, ConstCounter::new(n)));
        let series = Series {
            kind: MetricType::Counter,
            series: series.collect(),
        };
        self.register(family.unwrap_or(name), help, series);
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        let family = name.strip_suffix("_total");
        assert!(family.is_some(), "counter {name} ends in _total");
        self.register(family.unwrap_or(name), help, ConstCounter::new(value));
    }

    fn gauges(&mut self, name: &str, help: &str, series: impl IntoIterator<Item = (Labels, i64)>) {
        let series = series.into_iter().map(|(l, n)| (l, ConstGauge::new(n)));
        let series = Series {
            kind: MetricType::Gauge,
            series: series.collect(),
        };
        self.register(name, help, series);
    }

    fn gauge(&mut self, name: &str, help: &str, value: u64) {
        let value = i64::try_from(value).unwrap_or(i64::MAX);
        self.register(name, help, ConstGauge::new(value));
    }

    fn histograms(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Labels, HistogramSnapshot)>,
    ) {
        let series = Series {
            kind: MetricType::Histogram,
            series: series.into_iter().collect(),
        };
        self.register(name, help, series);
    }

    fn finish(self) -> String {
        let mut text = String::new();
        // Writing into a String does not fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// Whether the DC can grant now, apart from its stores: why not, in words.
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What `/readyz` checks: the stores this DC serves from, and the DC itself.
#[derive(Clone)]
pub struct Health {
    /// The global store.
    pub global: Arc<dyn GlobalStore>,
    /// This DC's store.
    pub records: Arc<dyn DcStore>,
    /// The DC's own readiness (its DC lease, shutdown).
    pub ready: Readiness,
}

impl Health {
    /// `Ok` when both stores answer their health check within
    /// [`HEALTH_CHECK_MS_MAX`] and the DC can grant; else why not, in words.
    pub async fn check(&self) -> Result<(), String> {
        (self.ready)()?;
        self.check_stores().await
    }

    async fn check_stores(&self) -> Result<(), String> {
        let both = async {
            self.global
                .health()
                .await
                .map_err(|e| format!("global store: {e}"))?;
            self.records
                .health()
                .await
                .map_err(|e| format!("dc store: {e}"))
        };
        match tokio::time::timeout(Duration::from_millis(HEALTH_CHECK_MS_MAX), both).await {
            Ok(checked) => checked,
            Err(_) => Err(format!(
                "the stores did not answer within {HEALTH_CHECK_MS_MAX} ms"
            )),
        }
    }
}

/// The routes of the metrics listener: `/metrics`, `/healthz` (the process
/// serves) and `/readyz` (the DC can grant: [`Health::check`]).
pub fn routes(metrics: Arc<Metrics>, health: Health) -> Router {
    let scrape = move || {
        let metrics = metrics.clone();
        async move {
            let content_type = [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)];
            (StatusCode::OK, content_type, metrics.render()).into_response()
        }
    };
    let ready = move || {
        let health = health.clone();
        async move {
            match health.check().await {
                Ok(()) => plain(StatusCode::OK, "ready\n".to_string()),
                Err(why) => plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {why}\n"),
                ),
            }
        }
    };
    Router::new()
        .route("/metrics", get(scrape))
        // Liveness: the process serves (restarting it helps nothing else).
        .route(
            "/healthz",
            get(|| async { plain(StatusCode::OK, "ok\n".to_string()) }),
        )
        .route("/readyz", get(ready))
}

/// What a path no route serves answers.
pub async fn not_found() -> Response {
    plain(
        StatusCode::NOT_FOUND,
        "try / (the status page), /metrics, /healthz or /readyz\n".to_string(),
    )
}

/// What `/metrics` answers in.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A plain-text answer.
fn plain(status: StatusCode, body: String) -> Response {
    let content_type = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    (status, content_type, body).into_response()
}

/// Serves `app` (the [`routes`] and the status page) on `listener` until
/// `shutdown` turns true.
pub async fn listen(listener: TcpListener, app: Router, mut shutdown: watch::Receiver<bool>) {
    let permits = Arc::new(Semaphore::new(METRICS_CONNECTIONS_MAX));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(METRICS_HEADER_READ_MS_MAX))
        .keep_alive(false);
    loop {
        // A permit first: at the cap, connections wait in the backlog.
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return, // never closed
            },
            _ = shutdown.changed() => return,
        };
        let stream = tokio::select! {
            stream = next_connection(&listener) => stream,
            _ = shutdown.changed() => return,
        };
        let service = TowerToHyperService::new(app.clone());
        let connection = http.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            let limit = Duration::from_millis(METRICS_CONNECTION_MS_MAX);
            if tokio::time::timeout(limit, connection).await.is_err() {
                tracing::debug!(
                    limit_ms = METRICS_CONNECTION_MS_MAX,
                    "metrics connection cut off"
                );
            }
            drop(permit);
        });
    }
}

/// What the endpoint accepts connections from: a [`TcpListener`], or a
/// test's listener that fails.
trait Accept {
    type Stream;
    fn accept(&self) -> impl std::future::Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Accept for TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept(&self) -> std::io::Result<tokio::net::TcpStream> {
        TcpListener::accept(self).await.map(|(stream, _)| stream)
    }
}

/// The next accepted connection. A failed accept (out of file descriptors,
/// say) fails again at once until something changes: it is logged and the
/// next try waits [`ACCEPT_ERROR_PAUSE_MS`] instead of spinning.
async fn next_connection<L: Accept>(listener: &L) -> L::Stream {
    loop {
        match listener.accept().await {
            Ok(stream) => return stream,
            Err(e) => {
                tracing::warn!(error = %e, pause_ms = ACCEPT_ERROR_PAUSE_MS, "metrics endpoint accept failed");
                tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
            }
        }
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
                "homing_request_duration_seconds_bucket{le=\"0.0001\",kind=\"resolve\"} 1"
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
    fn a_suspect_peer_is_a_gauge_and_each_suspicion_is_counted() {
        let m = Metrics::default();
        m.peer_suspect("fra", true);
        let text = m.render();
        assert!(text.contains("homing_peer_suspect{dc=\"fra\"} 1"), "{text}");
        m.peer_suspect("fra", false);
        m.peer_suspect("fra", true);
        m.peer_suspect("fra", false);
        let text = m.render();
        assert!(text.contains("homing_peer_suspect{dc=\"fra\"} 0"), "{text}");
        assert!(
            text.contains("homing_peer_suspicions_total{dc=\"fra\"} 2"),
            "{text}"
        );
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

    /// Fails its first `failures` accepts (as with EMFILE), then accepts.
    struct Failing {
        failures: u32,
        tried: std::sync::atomic::AtomicU32,
    }

    impl Accept for Failing {
        type Stream = u32;
        async fn accept(&self) -> std::io::Result<u32> {
            let tried = self.tried.fetch_add(1, Ordering::Relaxed) + 1;
            if tried <= self.failures {
                return Err(std::io::Error::other("too many open files"));
            }
            Ok(tried)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_accept_pauses_before_each_retry_instead_of_spinning() {
        const FAILURES: u32 = 5;
        let listener = Failing {
            failures: FAILURES,
            tried: Default::default(),
        };
        // The clock is paused: it moves only by the sleeps between tries.
        let started = tokio::time::Instant::now();
        let tries = next_connection(&listener).await;
        assert_eq!(tries, FAILURES + 1, "every failure retried, then accepted");
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(u64::from(FAILURES) * ACCEPT_ERROR_PAUSE_MS),
            "one pause per failed accept"
        );
    }
}
