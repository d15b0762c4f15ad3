//! homingd's driver of homing-node's [`Upkeep`]: every `interval` after the
//! last pass ended, one pass over what the DC store's expiry index says is
//! due — reap lapsed leases, abandon proven orphans and settle proven
//! members, trim the event log — run by [`Node::drive`] like every
//! homing-node `Stepper`; `report` logs and counts what the pass did.

use std::sync::Arc;
use std::time::Duration;

use homing_node::{Mutations, Upkeep, UpkeepEvent, UpkeepLimits};
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

/// One whole pass.
pub async fn pass(node: &Node, upkeep: &mut Upkeep) {
    upkeep.start(store_now());
    node.drive(upkeep).await;
}

/// Logs and metrics for one upkeep event.
pub(crate) fn report(node: &Node, event: UpkeepEvent) {
    match event {
        UpkeepEvent::Reaped(id) => tracing::info!(reservation = %id, "lease expired, reaped"),
        UpkeepEvent::Abandoned(id) => tracing::info!(reservation = %id, "orphan abandoned"),
        UpkeepEvent::Confirmed(id, settled) => {
            tracing::debug!(reservation = %id, settled, "in its chain")
        }
        UpkeepEvent::BadRecord(bad) => {
            node.metrics().upkeep_bad_record();
            tracing::warn!(reservation = %bad.entry, reason = %bad.reason, "unreadable record skipped by the upkeep")
        }
        UpkeepEvent::SettleFailed(id, f) => {
            tracing::warn!(reservation = %id, error = %f.into_reply(), "settling a proven member failed")
        }
        UpkeepEvent::ChangeFailed(id, f) => {
            tracing::warn!(reservation = %id, error = %f.into_reply(), "reap or abandon failed")
        }
        UpkeepEvent::ScanFailed(f) => {
            tracing::warn!(error = %f.into_reply(), "upkeep pass stopped early")
        }
        UpkeepEvent::Trimmed(before) => tracing::info!(before, "trimmed events"),
        UpkeepEvent::TrimFailed(f) => tracing::warn!(error = %f.into_reply(), "event trim failed"),
        UpkeepEvent::PassDone { active, event_head } => {
            if let Some(active) = active {
                node.metrics().set_active_leases(active);
            }
            if let Some(head) = event_head {
                node.metrics().set_event_head(head);
            }
        }
    }
}
