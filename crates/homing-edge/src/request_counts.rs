//! What the edge router counts as it routes, beyond its
//! [`crate::EdgeStats`] atomics: requests by outcome and the upstream
//! latency. Kept by the router; read by the `metrics` module at each scrape.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// Upper bounds of the upstream latency buckets, in seconds (50 µs to 10 s).
const UPSTREAM_BUCKETS_S: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    10.0,
];
/// A label set of one `name="value"` pair.
pub(crate) type Label = [(&'static str, &'static str); 1];

/// What the router counts beyond its [`crate::EdgeStats`].
#[derive(Debug)]
pub(crate) struct EdgeMetrics {
    /// Requests answered, by outcome: `forwarded`, or the reason the
    /// router answered itself.
    pub(crate) requests: Family<Label, Counter>,
    /// `requests`' `forwarded` counter, held so the hot path bumps an
    /// atomic without looking the label up.
    forwarded: Counter,
    /// From sending a request to an actor to its response head.
    pub(crate) upstream_seconds: Histogram,
}

impl Default for EdgeMetrics {
    fn default() -> EdgeMetrics {
        let requests: Family<Label, Counter> = Family::default();
        let forwarded = requests.get_or_create(&[("outcome", "forwarded")]).clone();
        EdgeMetrics {
            requests,
            forwarded,
            upstream_seconds: Histogram::new(UPSTREAM_BUCKETS_S),
        }
    }
}

impl EdgeMetrics {
    /// A request was answered by its actor.
    pub(crate) fn forwarded(&self) {
        self.forwarded.inc();
    }

    /// Requests answered by their actor so far.
    pub(crate) fn forwarded_total(&self) -> u64 {
        self.forwarded.get()
    }

    /// The router answered a request itself with `reason` (`not_found`, …).
    pub(crate) fn refused(&self, reason: &'static str) {
        self.requests.get_or_create(&[("outcome", reason)]).inc();
    }

    /// An actor sent its response head `elapsed` after the request went out.
    pub(crate) fn upstream(&self, elapsed: Duration) {
        self.upstream_seconds.observe(elapsed.as_secs_f64());
    }
}
