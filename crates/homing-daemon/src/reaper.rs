//! Background upkeep of the DC store: the reaper moves leases past expiry +
//! grace to `Released(Expired)`, and the orphan sweeper marks `Abandoned` the
//! records that lost a race but were left behind (a crash or an unreachable
//! peer between writing the record and winning the global entry or link).
//!
//! The sweeper abandons a record only on proof that it can never join the
//! chain — the key's global entry or its predecessor's link names another
//! reservation, and both are immutable — so a delayed write cannot later
//! link to an abandoned record.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use homing_core::{DcRecord, RecordState, ReservationId, StoreTime};
use homing_node::Change;
use homing_store::{SCAN_LIMIT_MAX, ScanCursor};
use tokio::sync::watch;

use crate::node::{Node, store_now};

/// Most confirmed reservations remembered between passes; past it the set is
/// cleared and confirmations are simply redone.
const CONFIRMED_MAX: usize = 100_000;

/// Whether a released record is part of its key's chain.
enum Membership {
    InChain,
    Orphan,
    Unknown,
}

/// What the upkeep does and how often.
#[derive(Debug, Clone, Copy)]
pub struct Upkeep {
    /// Time between passes.
    pub interval: Duration,
    /// A released record that lost its race is abandoned once this old, ms.
    pub orphan_age_ms: u64,
    /// Events kept for watchers; older ones are trimmed each pass.
    pub events_retained: u64,
}

/// Runs passes every `upkeep.interval` until `shutdown` turns true.
pub async fn run(node: Arc<Node>, upkeep: Upkeep, mut shutdown: watch::Receiver<bool>) {
    let mut confirmed = HashSet::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(upkeep.interval) => {}
            _ = shutdown.changed() => return,
        }
        if let Err(e) = pass(&node, upkeep.orphan_age_ms, &mut confirmed).await {
            tracing::warn!(error = %e, "reaper pass stopped early");
        }
        if let Err(e) = trim(&node, upkeep.events_retained).await {
            tracing::warn!(error = %e, "event trim failed");
        }
    }
}

/// Keeps the newest `retained` events of the DC's log.
pub async fn trim(node: &Node, retained: u64) -> Result<(), homing_store::StoreError> {
    let page = node.records().events(0, 0).await?;
    node.metrics().set_event_head(page.head);
    let keep_from = page.head.saturating_sub(retained) + 1;
    if page.oldest < keep_from {
        node.records().trim_events(keep_from).await?;
        tracing::info!(before = keep_from, "trimmed events");
    }
    Ok(())
}

/// One scan over every record of the DC.
pub async fn pass(
    node: &Node,
    orphan_age_ms: u64,
    confirmed: &mut HashSet<ReservationId>,
) -> Result<(), homing_store::StoreError> {
    if confirmed.len() > CONFIRMED_MAX {
        confirmed.clear();
    }
    let everything = homing_core::NamespaceScope::everything();
    let mut after: Option<ScanCursor> = None;
    let mut active = 0u64;
    loop {
        let page = node
            .records()
            .scan(&everything, "", after.as_ref(), SCAN_LIMIT_MAX)
            .await?;
        let done = page.len() < SCAN_LIMIT_MAX;
        after = page.last().map(ScanCursor::after);
        for record in page {
            let now = store_now();
            if record.expire(now, node.policy()).is_some() {
                reap(node, &record).await;
            } else if record.live_actor(now, node.policy()).is_some() {
                active += 1;
            }
            if is_sweepable(&record, now, orphan_age_ms) && !confirmed.contains(&record.id) {
                match membership(node, &record).await {
                    Membership::InChain => {
                        confirmed.insert(record.id.clone());
                    }
                    Membership::Orphan => abandon(node, &record).await,
                    Membership::Unknown => {}
                }
            }
        }
        if done {
            break;
        }
    }
    node.metrics().set_active_leases(active);
    Ok(())
}

fn is_sweepable(record: &DcRecord, now: StoreTime, orphan_age_ms: u64) -> bool {
    matches!(record.state, RecordState::Released { at, .. } if now.ms_since(at) >= orphan_age_ms)
}

async fn reap(node: &Node, record: &DcRecord) {
    match node.update(&record.id, Change::Expire).await {
        Ok(changed) if !changed.made() => {}
        Ok(_) => {
            tracing::info!(reservation = %record.id, key = %record.key, "lease expired, reaped")
        }
        Err(e) => tracing::warn!(reservation = %record.id, error = %e, "reap failed"),
    }
}

async fn abandon(node: &Node, record: &DcRecord) {
    match node.update(&record.id, Change::Abandon).await {
        Ok(changed) if !changed.made() => {}
        Ok(_) => tracing::info!(reservation = %record.id, key = %record.key, "orphan abandoned"),
        Err(e) => tracing::warn!(reservation = %record.id, error = %e, "abandon failed"),
    }
}

async fn membership(node: &Node, record: &DcRecord) -> Membership {
    match &record.predecessor {
        None => match node.global_entry(&record.key).await {
            Ok(Some(entry)) if entry == record.id => Membership::InChain,
            Ok(Some(_)) => Membership::Orphan,
            // Absent: a delayed set_if_absent could still land; leave it.
            Ok(None) | Err(_) => Membership::Unknown,
        },
        Some(predecessor) => {
            let segment = if predecessor.dc() == node.dc() {
                node.walk_segment(predecessor).await
            } else {
                node.peers()
                    .resolve_reservation(predecessor)
                    .await
                    .map_err(|e| e.to_reply())
            };
            match segment.ok().and_then(|s| s.links.into_iter().next()) {
                Some(link) if link.from == *predecessor && link.to == record.id => {
                    Membership::InChain
                }
                Some(link) if link.from == *predecessor => Membership::Orphan,
                // Not linked yet (a delayed link could still land), or no answer.
                _ => Membership::Unknown,
            }
        }
    }
}
