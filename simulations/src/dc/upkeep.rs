//! Each simulated DC's upkeep: homing-node's `Upkeep` — the pass homingd
//! runs (reap lapsed leases, abandon proven orphans, settle proven members,
//! reading only what the DC's expiry index says is due) — run as a stepper
//! task (`task.rs`) that holds the DC's `Upkeep` while its pass runs,
//! its store operations and peer requests each taking its latency. A
//! pass starts every `reaper_interval_ms` unless one still runs (homingd
//! waits the interval after a pass ends: the simulator's passes may start a
//! little earlier, never overlap) and trims the store's event log to
//! `events_retained` events. A crash loses the pass and the proofs remembered.

use crate::counter::Counter;
use homing_core::Mutations;
use homing_core::{DcId, LeasePolicy};
use homing_node::{Failure, Upkeep, UpkeepEvent, UpkeepLimits};
use homing_store::{SCAN_LIMIT_MAX, StoreError};

use super::ctx::DcCtx;
use super::task::Task;
use super::task::TaskStepper;
use crate::event::Event;
use crate::scenario::StoreSpec;
use crate::trace::NO_KEY;

/// A DC's upkeep as it starts: no proofs remembered.
pub(crate) fn new_upkeep(
    dc: DcId,
    policy: LeasePolicy,
    stores: &StoreSpec,
    mutations: Mutations,
) -> Upkeep {
    let limits = UpkeepLimits {
        // homingd's page: the most any backend returns.
        page_records: SCAN_LIMIT_MAX,
        orphan_age_ms: stores.orphan_age_ms,
        events_retained: Some(stores.events_retained),
    };
    Upkeep::new(dc, policy, limits, mutations)
}

/// A DC store's error as homingd reports it (homing-node's rule).
pub(crate) fn store_failure(dc: &DcId, e: StoreError) -> Failure {
    Failure::of_store(dc, e.is_unavailable(), e)
}

impl DcCtx<'_> {
    /// The DC's upkeep as it restarts: no proofs remembered.
    pub(crate) fn fresh_upkeep(&self) -> Upkeep {
        let dc = self.dc.id.clone();
        new_upkeep(dc, self.policy, &self.scenario.stores, self.rules.mutations)
    }

    /// The interval's tick: the next one is scheduled; a pass starts if the
    /// DC runs and none is in progress.
    pub(crate) fn reap(&mut self) {
        let interval = self.scenario.stores.reaper_interval_ms.max(1) * 1000;
        self.world
            .schedule(self.world.now + interval, Event::Reap { dc: self.addr() });
        if !self.inst.up {
            return;
        }
        // Taken by the pass's task until it ends: none may start meanwhile.
        let Some(mut upkeep) = self.inst.upkeep.take() else {
            return;
        };
        upkeep.start(self.dc.clock.store_time(self.world.now));
        let kind = TaskStepper::Upkeep(Box::new(upkeep));
        self.step_start(Task::new(self.me(), 0, NO_KEY, kind));
    }
}

/// The counter of an upkeep event.
pub(crate) fn upkeep_counter(event: &UpkeepEvent) -> Counter {
    match event {
        UpkeepEvent::Reaped(_) => Counter::LeaseReaped,
        UpkeepEvent::Abandoned(_) => Counter::OrphanAbandoned,
        UpkeepEvent::Confirmed(..) => Counter::OrphanProofMember,
        UpkeepEvent::BadRecord(_) => Counter::UpkeepBadRecord,
        UpkeepEvent::SettleFailed(..) => Counter::UpkeepSettleFailed,
        UpkeepEvent::ChangeFailed(..) => Counter::UpkeepChangeFailed,
        UpkeepEvent::ScanFailed(_) => Counter::UpkeepScanFailed,
        UpkeepEvent::SessionEnded(_) => Counter::SessionEnded,
        UpkeepEvent::SessionFailed(..) => Counter::UpkeepSessionFailed,
        UpkeepEvent::Trimmed(_) | UpkeepEvent::TrimFailed(_) => Counter::UpkeepTrim,
        UpkeepEvent::PassDone { .. } => Counter::UpkeepPass,
    }
}
