//! What this homingd knows of its DC now, as a [`DcReport`] (the answer to
//! `Request::DcReport`, what `homing dc status` shows per DC) and as the
//! status page's parts: its stores' health checks and one timed request to
//! each other DC. Every part is bounded in time.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use homing_core::{DcId, DcReport, PeerProbe, Probe};
use tokio::task::JoinSet;

use super::Node;

/// How long one store check may take before it counts as failed.
pub const STORE_READ_MS_MAX: u64 = 2_000;

/// `f` within `ms`, a timeout or its error in words.
pub async fn within<T, E: std::fmt::Display>(
    ms: u64,
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(Duration::from_millis(ms), f).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {ms} ms")),
    }
}

/// How long `check` took to succeed, bounded by [`STORE_READ_MS_MAX`].
async fn timed<E: std::fmt::Display>(
    what: &str,
    check: impl std::future::Future<Output = Result<(), E>>,
) -> Result<Duration, String> {
    let started = Instant::now();
    within(STORE_READ_MS_MAX, what, check).await?;
    Ok(started.elapsed())
}

/// A check's outcome on the wire.
fn probe(outcome: Result<Duration, String>) -> Probe {
    match outcome {
        Ok(took) => Probe::Answered {
            micros: u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        },
        Err(why) => Probe::Failed(why),
    }
}

impl Node {
    /// This DC now: lease counts from the last upkeep pass, its stores'
    /// health checks and a timed request to every other DC, all at once.
    pub async fn report(&self) -> DcReport {
        let ((global_store, dc_store), peers) =
            tokio::join!(self.store_health(), self.probe_peers());
        let metrics = self.metrics();
        DcReport {
            live_leases: metrics.active_leases(),
            sessions: metrics.sessions(),
            dc_store: probe(dc_store),
            global_store: probe(global_store),
            peers: peers
                .into_iter()
                .map(|(dc, outcome)| PeerProbe {
                    dc,
                    probe: probe(outcome),
                })
                .collect(),
        }
    }

    /// Each store's health check and how long it took: the global store's,
    /// then the DC store's.
    pub async fn store_health(&self) -> (Result<Duration, String>, Result<Duration, String>) {
        tokio::join!(
            timed("global store", self.global().health()),
            timed("dc store", self.records().health()),
        )
    }

    /// One timed request to every other DC in the peer table, all at once
    /// (each bounded by the peer timeout), by DC name.
    pub async fn probe_peers(&self) -> Vec<(DcId, Result<Duration, String>)> {
        let here = self.dc();
        let dcs: BTreeSet<DcId> = self
            .peers()
            .addresses()
            .into_iter()
            .map(|(dc, _)| dc)
            .filter(|dc| dc != here)
            .collect();
        let mut probes = JoinSet::new();
        for dc in dcs {
            let peers = self.peers().clone();
            probes.spawn(async move {
                let outcome = peers.probe(&dc).await.map_err(|e| e.to_string());
                (dc, outcome)
            });
        }
        let mut reached = Vec::new();
        while let Some(probe) = probes.join_next().await {
            // A probe task only panics if the runtime is going away.
            if let Ok(probe) = probe {
                reached.push(probe);
            }
        }
        reached.sort_by(|a, b| a.0.cmp(&b.0));
        reached
    }
}
