//! The DC lease in the simulator (DESIGN.md §7.5), driven as homingd's
//! `dc_lease` module drives homing-node's [`DcLease`]: the start-up check of
//! the DC store's allocator against the floor the DC published, the renewal
//! loop (each renewal a message to the global store, bounded by the renewal
//! period), the gate on host-lease grants and renewals
//! ([`DcLease::covers`], asked by homing-node's `Effect::Cover`) and the wait of a record
//! write whose reservation unique or token is above the published marks
//! (homingd's `publish_marks_for`: asks the next renewal to publish them,
//! fails `Unavailable` after [`MARKS_WAIT_MS`]).
//!
//! The global store (`global.rs`) keeps each DC's lease as homing-store's
//! lease table does: when it received the last renewal (true time: the
//! store's clock), its terms, and its marks (never going down);
//! [`DcStanding::judge`] says when it is expired, and
//! [`crate::Invariant::DcExpiredNoHolder`] is checked at that instant.
//!
//! A `cut_from_global` fault makes every renewal, global read and global
//! write of the DC fail while hosts, routers and peers still reach it.

use crate::counter::{Counter, Timing};
use homing_core::Mutations;
use homing_core::{
    DcId, DcMarks, DcRenewal, DcStanding, DcTerms, ErrorKind, ErrorReply, LeasePolicy,
};
use homing_node::dc::dc_lease::MARKS_WAIT_MS;
use homing_node::dc::dc_lease::RENEW_RETRY_MS;
use homing_node::{
    DcLease, DcLeaseChange, DcLeasePoll, Failure, NodeTime, StartCheck, start_check,
};

use super::Next;
use super::ctx::DcCtx;
use super::store::{Asked, StoreCall};
use super::task::Task;
use crate::event::Event;
use homing_node::StoreOp as DcOp;

/// The DC-lease terms homingd derives from a lease policy by default: a DC
/// lease of twice the host lease, renewed every tenth of it.
pub fn default_terms(policy: &LeasePolicy) -> (DcTerms, u64) {
    let ttl_ms = policy.ttl_ms().saturating_mul(2);
    let terms = DcTerms {
        ttl_ms,
        host_lease_ttl_max_ms: policy.ttl_ms(),
        grace_ms: policy.grace_ms(),
    };
    (terms, (ttl_ms / 10).max(1))
}

/// A DC's lease as the DC's homingd holds it (volatile: a restart starts over).
#[derive(Debug)]
pub struct DcLeaseDriver {
    /// homing-node's lease.
    pub lease: DcLease,
    /// How often it is renewed, ms.
    pub renew_every_ms: u64,
    /// The start-up check has not been answered yet (the global store was
    /// unreachable at start): nothing is granted or written until it is.
    pub unchecked: bool,
    /// The renewal in flight: its number and its send time.
    pub renewing: Option<(u64, NodeTime)>,
    /// Numbers renewals.
    pub renewals: u64,
    /// Voids older wake-up timers of the renewal loop.
    pub generation: u64,
    /// Writes waiting for marks: task id → (task, its write).
    pub(crate) parked: std::collections::BTreeMap<u64, (Box<Task>, StoreCall)>,
    /// Where the last failed reconciliation pass got to (homingd keeps it
    /// in its node: a crash loses it).
    pub resumption: Option<homing_node::Resumption>,
}

impl DcLeaseDriver {
    /// A lease not yet checked nor renewed.
    pub fn new(policy: &LeasePolicy, mutations: Mutations) -> DcLeaseDriver {
        let (terms, renew_every_ms) = default_terms(policy);
        DcLeaseDriver {
            lease: DcLease::new(terms, renew_every_ms).with_mutations(mutations),
            renew_every_ms,
            unchecked: true,
            renewing: None,
            renewals: 0,
            generation: 0,
            parked: std::collections::BTreeMap::new(),
            resumption: None,
        }
    }
}

/// A failure as the DC's store client reports an unreachable global store.
pub(crate) fn global_unavailable(dc: &DcId, why: &str) -> ErrorReply {
    ErrorReply::new(ErrorKind::Unavailable { dc: dc.clone() }, why)
}

impl DcCtx<'_> {
    /// Whether the DC is cut off from the global store now.
    pub(crate) fn cut_from_global(&self) -> bool {
        self.global.cut_off(&self.dc.id, self.world.now)
    }

    /// `Unavailable` while the DC is cut off from the global store: what
    /// every global read or write of the DC answers then.
    pub(crate) fn global_reachable(&self) -> Result<(), ErrorReply> {
        if self.cut_from_global() {
            return Err(global_unavailable(&self.dc.id, "cut from the global store"));
        }
        Ok(())
    }

    /// The DC store's allocator floor: the durable high-water mark of the
    /// hi-lo allocator, at or above every unique it handed out (0 for a
    /// store that never allocated).
    pub(crate) fn allocator_floor(&self) -> u64 {
        self.dc.store.allocator_floor()
    }

    /// The DC (re)starts its lease: homingd's `open` (the check against the
    /// store's marks, if the store answers) and the first renewal before
    /// serving. `false`: the DC must not serve (its store is below the
    /// floor it published: wiped, or restored from an old backup).
    pub(crate) fn lease_open(&mut self) -> bool {
        self.inst.lease = DcLeaseDriver::new(&self.policy, self.rules.mutations);
        if !self.cut_from_global() && !self.lease_check() {
            return false;
        }
        // The first renewal before serving: a DC whose global store answers
        // grants from its first request.
        if !self.inst.lease.unchecked && !self.cut_from_global() {
            let sent = self.node_now();
            if let DcLeasePoll::Renew { terms, marks } = self.inst.lease.lease.poll(sent) {
                let kept = self.lease_land(terms, marks);
                let now = self.node_now();
                let renewal = DcRenewal::Renewed(kept);
                self.inst.lease.lease.handle_renewed(sent, renewal, now);
                self.reconcile();
            }
        }
        self.lease_drive();
        true
    }

    /// The start-up check against what the global store keeps (homingd's
    /// `dc_lease::check`); `false`: refused, the lease stopped for good.
    fn lease_check(&mut self) -> bool {
        // Invariant: the global store keeps a lease for every DC.
        let published = self.global.lease(&self.dc.id).expect("a dc").marks;
        let store_floor = self.allocator_floor();
        let lease = &mut self.inst.lease;
        lease.unchecked = false;
        // The simulator never retires a DC nor starts above the floor.
        // The simulator publishes no event head (its stores keep none).
        if start_check(&published, false, store_floor, 0, false) != StartCheck::Serve {
            lease.lease.stop();
            self.measurements.count(Counter::DcRefusedBelowFloor);
            return false;
        }
        lease.lease.checked(published, store_floor, 0);
        true
    }

    /// A renewal of the DC lands at the global store now: its receipt, terms
    /// and marks are kept; the marks the store keeps now.
    fn lease_land(&mut self, terms: DcTerms, marks: DcMarks) -> DcMarks {
        let kept = self.global.renew(&self.dc.id, terms, marks, self.world.now);
        let at = self.world.now + terms.expires_after_ms() * 1000;
        let received_us = self.world.now;
        self.world.schedule(
            at,
            Event::DcLeaseExpiry {
                dc: self.addr(),
                received_us,
            },
        );
        kept
    }

    /// Runs the DC's renewal loop until it waits.
    pub(crate) fn lease_drive(&mut self) {
        if !self.inst.up {
            return;
        }
        if self.inst.lease.unchecked {
            if self.cut_from_global() || !self.lease_check() {
                let at = self.world.now + RENEW_RETRY_MS * 1000;
                return self.lease_wake_at(at);
            }
            self.release_parked_writes();
        }
        let sent = self.node_now();
        match self.inst.lease.lease.poll(sent) {
            DcLeasePoll::Renew { terms, marks } => {
                let lease = &mut self.inst.lease;
                lease.renewals += 1;
                let seq = lease.renewals;
                lease.renewing = Some((seq, sent));
                let every_us = lease.renew_every_ms * 1000;
                let epoch = self.inst.epoch;
                let dc = self.addr();
                self.measurements.count(Counter::DcLeaseRenewalSent);
                // Bounded by the renewal period, as homingd's loop is.
                self.world.schedule(
                    self.world.now + every_us,
                    Event::DcRenewalTimeout { dc, epoch, seq },
                );
                if self.cut_from_global() {
                    return;
                }
                let ms = self.scenario.stores.global_write_ms;
                let delay = (ms * 1000.0) as u64 + 1;
                let event = Event::DcRenewalLands {
                    dc,
                    epoch,
                    seq,
                    terms,
                    marks,
                };
                self.world.schedule(self.world.now + delay, event);
            }
            DcLeasePoll::Wait { until } => {
                let at = self.dc.clock.first_true_us_at_us(until.as_us());
                self.lease_wake_at(at);
            }
            DcLeasePoll::InFlight | DcLeasePoll::Stopped => {}
        }
    }

    fn lease_wake_at(&mut self, at_us: u64) {
        let dc = &mut *self.inst;
        dc.lease.generation += 1;
        let event = Event::DcLeaseTick {
            dc: dc.addr,
            epoch: dc.epoch,
            generation: dc.lease.generation,
        };
        self.world.schedule(at_us, event);
    }

    /// The renewal loop's timer.
    pub(crate) fn lease_tick(&mut self, epoch: u32, generation: u64) {
        let dc = &*self.inst;
        if dc.up && dc.epoch == epoch && dc.lease.generation == generation {
            self.lease_drive();
        }
    }

    /// Renewal `seq` of the DC reaches the global store; its answer reaches
    /// the DC unless the DC is cut off by now.
    pub(crate) fn renewal_lands(&mut self, epoch: u32, seq: u64, terms: DcTerms, marks: DcMarks) {
        let kept = self.lease_land(terms, marks);
        let dc = &*self.inst;
        let current = dc.up && dc.epoch == epoch && dc.lease.renewing.map(|r| r.0) == Some(seq);
        if !current || self.cut_from_global() {
            return;
        }
        let Some((_, sent)) = self.inst.lease.renewing.take() else {
            return;
        };
        let now = self.node_now();
        let change = self
            .inst
            .lease
            .lease
            .handle_renewed(sent, DcRenewal::Renewed(kept), now);
        self.count_change(change);
        self.reconcile();
        self.release_parked_writes();
        self.lease_drive();
    }

    /// Renewal `seq` of the DC was not answered within the renewal period.
    pub(crate) fn renewal_timeout(&mut self, epoch: u32, seq: u64) {
        let dc = &*self.inst;
        if !dc.up || dc.epoch != epoch || dc.lease.renewing.map(|r| r.0) != Some(seq) {
            return;
        }
        self.inst.lease.renewing = None;
        self.measurements.count(Counter::DcLeaseRenewalFailed);
        let now = self.node_now();
        let change = self.inst.lease.lease.handle_failed(now);
        self.count_change(change);
        self.lease_drive();
    }

    fn count_change(&mut self, change: DcLeaseChange) {
        match change {
            DcLeaseChange::Same => {}
            DcLeaseChange::Regained => self.measurements.count(Counter::DcLeaseRegained),
            DcLeaseChange::Lost => self.measurements.count(Counter::DcLeaseLost),
            DcLeaseChange::Retired => self.measurements.count(Counter::DcLeaseRetired),
        }
    }

    /// A record write of task `tid`: on to the store if the published marks
    /// cover it (homingd's `publish_marks_for`), else parked until a
    /// renewal publishes them or [`MARKS_WAIT_MS`] passes. `None`: parked.
    pub(crate) fn marks_for_write(
        &mut self,
        tid: u64,
        task: Box<Task>,
        op: StoreCall,
    ) -> Option<(Box<Task>, StoreCall)> {
        let StoreCall::Dc(DcOp::Write { record, .. }) = &op else {
            return Some((task, op));
        };
        let (unique, token) = (record.id.unique(), record.token);
        let lease = &mut self.inst.lease;
        if !lease.unchecked && lease.lease.admits(unique, token) {
            return Some((task, op));
        }
        if lease.lease.retired() {
            self.measurements.count(Counter::WriteRefusedDcStopped);
            let e = global_unavailable(&self.dc.id, "this dc may never hold its dc lease again");
            self.store_failed(tid, task, Asked::DcStore, e);
            return None;
        }
        let floor = self.allocator_floor();
        let lease = &mut self.inst.lease;
        lease.lease.want(floor.max(unique), token);
        lease.parked.insert(tid, (task, op));
        self.measurements.count(Counter::WriteWaitsForMarks);
        let epoch = self.inst.epoch;
        let at = self.world.now + MARKS_WAIT_MS * 1000;
        let dc = self.addr();
        self.world.schedule(
            at,
            Event::MarksTimeout {
                dc,
                epoch,
                task: tid,
            },
        );
        if self.inst.lease.renewing.is_none() {
            self.lease_drive();
        }
        None
    }

    /// Parked writes the published marks now cover go on to the store.
    fn release_parked_writes(&mut self) {
        let lease = &self.inst.lease;
        let ready: Vec<u64> = lease
            .parked
            .iter()
            .filter(|(_, (_, op))| match op {
                StoreCall::Dc(DcOp::Write { record, .. }) => {
                    lease.lease.admits(record.id.unique(), record.token)
                }
                _ => true,
            })
            .map(|(tid, _)| *tid)
            .collect();
        for tid in ready {
            if let Some((task, op)) = self.inst.lease.parked.remove(&tid) {
                self.continue_task(tid, task, Next::Store(op));
            }
        }
    }

    /// A parked write's wait for marks ran out: it fails `Unavailable`.
    pub(crate) fn marks_timeout(&mut self, epoch: u32, tid: u64) {
        if !self.inst.up || self.inst.epoch != epoch {
            return;
        }
        let Some((task, op)) = self.inst.lease.parked.remove(&tid) else {
            return;
        };
        self.measurements.count(Counter::WriteMarksWaitTimedOut);
        let e = global_unavailable(
            &self.dc.id,
            "the global store has not acknowledged the marks the record needs in time",
        );
        self.store_failed(tid, task, op.asked(), e);
    }

    /// A global read or write of task `tid` failed: the DC is cut off.
    pub(crate) fn global_failed(&mut self, epoch: u32, tid: u64) {
        if !self.inst.up || self.inst.epoch != epoch {
            return;
        }
        let Some(mut task) = self.inst.tasks.remove(&tid) else {
            return;
        };
        self.world.current_key = task.key;
        task.waiting = None;
        self.measurements.count(Counter::GlobalOpFailedCutOff);
        let e = global_unavailable(&self.dc.id, "the global store cannot be reached");
        self.store_failed(tid, task, Asked::Global, e);
    }

    /// A store operation of task `tid` failed with `e` (an unreachable
    /// store); `asked` says which: an operation of the DC's store, a
    /// segment read from it, or the global store. Each kind of task
    /// handles it as homingd's driver does.
    pub(crate) fn store_failed(&mut self, tid: u64, task: Box<Task>, asked: Asked, e: ErrorReply) {
        self.world.current_key = task.key;
        let answer = super::task::failed_answer(asked, Failure::from_reply(e));
        self.step_answered(tid, task, answer);
    }

    /// The global store's judgement of the DC's lease reaches Expired now
    /// (unless a later renewal landed): no host lease it granted may still act.
    pub(crate) fn lease_expiry(&mut self, received_us: u64) {
        // Invariant: the global store keeps a lease for every DC.
        let kept = self.global.lease(&self.dc.id).expect("a dc");
        if kept.received_us != Some(received_us) {
            return;
        }
        debug_assert_eq!(kept.standing(self.world.now), DcStanding::Expired);
        self.measurements.count(Counter::DcLeaseExpiredInStore);
        let dc = self.dc.id.clone();
        self.checker
            .on_dc_lease_expired(&dc, received_us, self.world.now);
    }

    /// The DC's cut from the global store, begun at `start_us`, ends: how
    /// long after it began the last host lease the DC granted stopped acting
    /// (0: none acted then), or a count of cuts that ended with some acting.
    pub(crate) fn cut_ends(&mut self, start_us: u64) {
        let dc = self.dc.id.clone();
        if !self.checker.holders_of(&dc).is_empty() {
            self.measurements
                .count(Counter::DcCutEndedWithHoldersActing);
            return;
        }
        let last = self.checker.last_stop_us.get(&dc).copied().unwrap_or(0);
        let after = last.saturating_sub(start_us);
        self.measurements
            .duration(Timing::DcCutHostsStoppedAfter, after);
    }
}
