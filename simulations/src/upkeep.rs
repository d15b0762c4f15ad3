//! Each simulated DC's upkeep: homing-node's `Upkeep` — the pass homingd
//! runs (reap lapsed leases, abandon proven orphans, settle proven members,
//! reading only what the DC's expiry index says is due) — performed with
//! simulated store operations and peer requests, each taking its latency. A
//! pass starts every `reaper_interval_ms` unless one still runs (homingd
//! waits the interval after a pass ends: the simulator's passes may start a
//! little earlier, never overlap) and trims the store's event log to
//! `events_retained` events. A crash loses the pass and the proofs remembered.

use crate::counter::Counter;
use homing_core::{DcId, LeasePolicy, Segment};
use homing_node::{Failure, Mutations, Upkeep, UpkeepEvent, UpkeepLimits, UpkeepPoll};
use homing_store::{SCAN_LIMIT_MAX, StoreError};

use crate::dc::{Next, StoreOp, Task, TaskKind};
use crate::scenario::StoreSpec;
use crate::sim::{Event, NodeId, Sim};
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

impl Sim {
    /// DC `d`'s upkeep as it restarts: no proofs remembered.
    pub(crate) fn fresh_upkeep(&self, d: usize) -> Upkeep {
        let dc = self.dcs[d].id.clone();
        new_upkeep(dc, self.policy, &self.scenario.stores, self.rules.mutations)
    }

    /// The interval's tick: the next one is scheduled; a pass starts if the
    /// DC runs and none is in progress.
    pub(crate) fn reap(&mut self, d: usize) {
        let interval = self.scenario.stores.reaper_interval_ms.max(1) * 1000;
        self.schedule(self.now + interval, Event::Reap { dc: d as u16 });
        if !self.dcs[d].up || self.dcs[d].upkeep.running() {
            return;
        }
        let now = self.dcs[d].clock.store_time(self.now);
        self.dcs[d].upkeep.start(now);
        let task = Task::new(NodeId::Dc(d as u16), 0, NO_KEY, TaskKind::Upkeep);
        let tid = self.new_task_id(d);
        self.upkeep_drive(d, tid, task);
    }

    /// A proof's read of the global entry or of this DC's segment completed.
    pub(crate) fn upkeep_store_done(&mut self, d: usize, tid: u64, task: Task, op: StoreOp) {
        match op {
            StoreOp::GlobalGet { key, read } => {
                let latest = homing_node::GlobalRead::Latest;
                debug_assert_eq!(read, latest, "upkeep's proof reads the latest entry");
                let entry = self.global.get(&key).cloned();
                let answer = homing_node::GlobalAnswer::Entry(entry);
                self.dcs[d].upkeep.handle_global(Ok(answer));
            }
            StoreOp::Segment(id) => {
                let segment = self.local_segment(d, &id);
                let segment = segment.map_err(homing_node::segment_failure);
                self.dcs[d].upkeep.handle_segment(segment);
            }
            StoreOp::Dc(_) => unreachable!("the DC store's answers go through dc_stored"),
        }
        self.upkeep_drive(d, tid, task);
    }

    /// The predecessor's DC answered (or did not).
    pub(crate) fn upkeep_peer_answer(
        &mut self,
        d: usize,
        tid: u64,
        task: Task,
        segment: Result<Segment, Failure>,
    ) {
        self.dcs[d].upkeep.handle_segment(segment);
        self.upkeep_drive(d, tid, task);
    }

    /// Runs the pass until it needs a store or a peer, or ends.
    pub(crate) fn upkeep_drive(&mut self, d: usize, tid: u64, task: Task) {
        let poll = self.dcs[d].upkeep.poll();
        while let Some(event) = self.dcs[d].upkeep.poll_event() {
            self.measurements.count(match event {
                UpkeepEvent::Reaped(_) => Counter::LeaseReaped,
                UpkeepEvent::Abandoned(_) => Counter::OrphanAbandoned,
                UpkeepEvent::Confirmed(..) => Counter::OrphanProofMember,
                UpkeepEvent::BadRecord(_) => Counter::UpkeepBadRecord,
                UpkeepEvent::SettleFailed(..) => Counter::UpkeepSettleFailed,
                UpkeepEvent::ChangeFailed(..) => Counter::UpkeepChangeFailed,
                UpkeepEvent::ScanFailed(_) => Counter::UpkeepScanFailed,
                UpkeepEvent::Trimmed(_) | UpkeepEvent::TrimFailed(_) => Counter::UpkeepTrim,
                UpkeepEvent::PassDone { .. } => Counter::UpkeepPass,
            });
        }
        let next = match poll {
            UpkeepPoll::Store(op) => Next::Store(StoreOp::Dc(op)),
            UpkeepPoll::Global(homing_node::GlobalOp::Entry { key, read }) => {
                Next::Store(StoreOp::GlobalGet { key, read })
            }
            UpkeepPoll::Global(op) => unreachable!("upkeep reads only entries: {op:?}"),
            // An unknown DC is no answer: the proof waits (any failure does).
            UpkeepPoll::Reservation(id) => match self.ask_segment(d, id) {
                Ok(next) => next,
                Err(failure) => return self.upkeep_peer_answer(d, tid, task, Err(failure)),
            },
            UpkeepPoll::Idle => return,
        };
        self.dc_continue(d, tid, task, next);
    }
}
