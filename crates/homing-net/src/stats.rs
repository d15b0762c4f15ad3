//! `ServerStats`: what a server counts about its connections (open by role,
//! handshakes in progress, refusals, closes, failed handshakes, buffered
//! request bytes), for metrics and tests; and how failures reach the log.
//! A flood of forged handshakes must not become a flood of log lines: the
//! first failure of each kind in an interval is logged with its details,
//! the rest are counted and summed up in one line when the interval ends.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tracing::warn;

use std::sync::Arc;

use crate::admission::{Admission, ROLES, role_index};
use crate::lock;

/// How a connection ended, as counted in [`ConnectionStats::closes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CloseKind {
    /// The caller closed it (CONNECTION_CLOSE received).
    Graceful,
    /// Nothing was heard from the caller for the idle timeout.
    IdleTimeout,
    /// A transport error or reset ended it.
    Error,
    /// This server closed it (shutdown, refusal after the handshake).
    Local,
}

impl CloseKind {
    const ALL: [CloseKind; 4] = [
        CloseKind::Graceful,
        CloseKind::IdleTimeout,
        CloseKind::Error,
        CloseKind::Local,
    ];

    /// The label in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseKind::Graceful => "graceful",
            CloseKind::IdleTimeout => "idle_timeout",
            CloseKind::Error => "error",
            CloseKind::Local => "local",
        }
    }

    /// How `error` (the reason a served connection ended) counts.
    pub(crate) fn of(error: &quinn::ConnectionError) -> CloseKind {
        use quinn::ConnectionError as E;
        match error {
            E::ApplicationClosed(_) | E::ConnectionClosed(_) => CloseKind::Graceful,
            E::TimedOut => CloseKind::IdleTimeout,
            E::LocallyClosed => CloseKind::Local,
            _ => CloseKind::Error,
        }
    }
}

/// A point-in-time copy of a server's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// Connections holding a slot now, by role name (node, host, router, admin).
    pub open: BTreeMap<&'static str, usize>,
    /// TLS handshakes in progress now.
    pub handshakes: usize,
    /// Connections refused so far, by (role, reason); the role is
    /// `unauthenticated` for refusals before the handshake.
    pub refusals: BTreeMap<(&'static str, &'static str), u64>,
    /// Connections ended so far, by how ([`CloseKind::as_str`]).
    pub closes: BTreeMap<&'static str, u64>,
    /// Handshakes that failed so far, by reason (timeout, version_mismatch, tls).
    pub handshake_failures: BTreeMap<&'static str, u64>,
    /// QUIC Retry packets sent to make a caller prove its address.
    pub retries: u64,
    /// Request bytes the server holds in partly read frames now.
    pub request_bytes_buffered: usize,
    /// The most request bytes held at once in partly read frames of one
    /// connection since the server started.
    pub connection_request_bytes_peak: usize,
}

/// A running server's counters, readable at any time (cheap to clone).
#[derive(Clone)]
pub struct ServerStats {
    pub(crate) counters: Arc<Counters>,
    pub(crate) admission: Arc<Admission>,
}

impl std::fmt::Debug for ServerStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.snapshot().fmt(f)
    }
}

impl ServerStats {
    /// A copy of every counter now.
    pub fn snapshot(&self) -> ConnectionStats {
        let open_by_role = self.admission.open_by_role();
        let mut stats = self.counters.snapshot();
        stats.open = ROLES
            .iter()
            .map(|role| (role.as_str(), open_by_role[role_index(*role)]))
            .collect();
        stats
    }
}

/// The live counters; see [`ConnectionStats`] for their meaning.
#[derive(Default)]
pub(crate) struct Counters {
    handshakes: AtomicUsize,
    refusals: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    closes: [AtomicU64; 4],
    handshake_failures: Mutex<BTreeMap<&'static str, u64>>,
    retries: AtomicU64,
    request_bytes_buffered: AtomicUsize,
    connection_request_bytes_peak: AtomicUsize,
    summary: Mutex<Summary>,
}

/// Failures since the last summary line, by what failed.
#[derive(Default)]
struct Summary {
    counts: BTreeMap<&'static str, u64>,
}

impl Counters {
    fn snapshot(&self) -> ConnectionStats {
        ConnectionStats {
            open: BTreeMap::new(),
            handshakes: self.handshakes.load(Ordering::Relaxed),
            refusals: lock(&self.refusals).clone(),
            closes: CloseKind::ALL
                .iter()
                .zip(&self.closes)
                .map(|(kind, n)| (kind.as_str(), n.load(Ordering::Relaxed)))
                .collect(),
            handshake_failures: lock(&self.handshake_failures).clone(),
            retries: self.retries.load(Ordering::Relaxed),
            request_bytes_buffered: self.request_bytes_buffered.load(Ordering::Relaxed),
            connection_request_bytes_peak: self
                .connection_request_bytes_peak
                .load(Ordering::Relaxed),
        }
    }

    pub(crate) fn handshakes_in_progress(&self) -> usize {
        self.handshakes.load(Ordering::Relaxed)
    }

    pub(crate) fn handshake_started(&self) {
        self.handshakes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn handshake_ended(&self) {
        self.handshakes.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn retried(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn closed(&self, kind: CloseKind) {
        let index = CloseKind::ALL
            .iter()
            .position(|k| *k == kind)
            .expect("ALL lists every kind");
        self.closes[index].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refusal; whether it is the first of its kind this interval
    /// (and so worth a log line of its own).
    pub(crate) fn refused(&self, role: &'static str, reason: &'static str) -> bool {
        *lock(&self.refusals).entry((role, reason)).or_default() += 1;
        self.first_this_interval(reason)
    }

    /// Counts a failed handshake; whether it is the first of its kind this
    /// interval (and so worth a log line of its own).
    pub(crate) fn handshake_failed(&self, reason: &'static str) -> bool {
        *lock(&self.handshake_failures).entry(reason).or_default() += 1;
        self.first_this_interval(reason)
    }

    fn first_this_interval(&self, what: &'static str) -> bool {
        let mut summary = lock(&self.summary);
        let n = summary.counts.entry(what).or_default();
        *n += 1;
        *n == 1
    }

    /// Logs one line summing up the failures and refusals since the last
    /// call, if there were any, and starts a new interval.
    pub(crate) fn log_summary(&self, interval_ms: u64) {
        let counts = std::mem::take(&mut lock(&self.summary).counts);
        if counts.is_empty() {
            return;
        }
        let total: u64 = counts.values().sum();
        let by_reason = counts
            .iter()
            .map(|(what, n)| format!("{what}={n}"))
            .collect::<Vec<_>>()
            .join(",");
        warn!(interval_ms, total, %by_reason,
            "handshakes failed or connections refused in the last interval");
    }

    /// `added` more bytes are held in partly read frames, which makes
    /// `connection_bytes` held for their connection.
    pub(crate) fn buffer(&self, added: usize, connection_bytes: usize) {
        self.request_bytes_buffered
            .fetch_add(added, Ordering::Relaxed);
        self.connection_request_bytes_peak
            .fetch_max(connection_bytes, Ordering::Relaxed);
    }

    /// `removed` bytes of partly read frames were let go.
    pub(crate) fn unbuffer(&self, removed: usize) {
        self.request_bytes_buffered
            .fetch_sub(removed, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_failures_logs_the_first_of_each_kind_per_interval_and_counts_all() {
        let counters = Counters::default();
        assert!(counters.handshake_failed("tls"), "the first is logged");
        for _ in 0..10_000 {
            assert!(
                !counters.handshake_failed("tls"),
                "the rest are only counted"
            );
        }
        assert!(counters.refused("router", "identity_share"));
        assert!(counters.handshake_failed("timeout"));
        counters.log_summary(10_000);
        assert!(
            counters.handshake_failed("tls"),
            "a new interval logs again"
        );
        let stats = counters.snapshot();
        assert_eq!(stats.handshake_failures["tls"], 10_002);
        assert_eq!(stats.handshake_failures["timeout"], 1);
        assert_eq!(stats.refusals[&("router", "identity_share")], 1);
    }
}
