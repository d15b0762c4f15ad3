//! homingd's driver of homing-node's [`Upkeep`]: every `interval` after the
//! last pass ended, one pass over what the DC store's expiry index says is
//! due — reap lapsed leases, abandon proven orphans and settle proven
//! members, trim the event log — run by [`Node::drive`] like every
//! homing-node `Stepper` (which logs and counts what the pass did).

use std::sync::Arc;
use std::time::Duration;

use homing_core::Mutations;
use homing_node::{Upkeep, UpkeepLimits};
use homing_store::SCAN_LIMIT_MAX;
use tokio::sync::watch;

use crate::node::{Node, store_now};

/// What the upkeep does and how often.
#[derive(Debug, Clone, Copy)]
pub struct UpkeepConfig {
    /// Time between passes.
    pub interval: Duration,
    /// A released record that lost its race is abandoned once this old, ms.
    pub orphan_age_ms: u64,
    /// Events kept for watchers; older ones are trimmed each pass.
    pub events_retained: u64,
}

/// Runs passes every `config.interval` until `shutdown` turns true.
pub async fn run(node: Arc<Node>, config: UpkeepConfig, mut shutdown: watch::Receiver<bool>) {
    let mut upkeep = upkeep(&node, config);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(config.interval) => {}
            _ = shutdown.changed() => return,
        }
        pass(&node, &mut upkeep).await;
    }
}

/// homing-node's upkeep for `node` with `config`.
pub fn upkeep(node: &Node, config: UpkeepConfig) -> Upkeep {
    let limits = UpkeepLimits {
        page_records: SCAN_LIMIT_MAX,
        orphan_age_ms: config.orphan_age_ms,
        events_retained: Some(config.events_retained),
    };
    Upkeep::new(node.dc().clone(), *node.policy(), limits, Mutations::NONE)
}

/// One whole pass, then the DC store's session counts for the metrics.
pub async fn pass(node: &Node, upkeep: &mut Upkeep) {
    upkeep.start(store_now());
    node.drive(upkeep).await;
    let counted = node.timed("dc_session_counts", node.records().session_counts());
    match counted.await {
        Ok(Some(counts)) => node.metrics().set_sessions(counts),
        Ok(None) => {}
        Err(e) => {
            tracing::debug!(error = %e, "counting host sessions failed (metrics keep the last count)")
        }
    }
}
