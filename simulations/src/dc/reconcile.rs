//! A simulated DC back from a lapsed lease reconciles the takeovers of its
//! tails as homingd does: homing-node's [`Reconcile`] as a task of the DC
//! (one at a time), its page reads answered from the global store's
//! successions at once (as the acquire's succession reads are: what a read
//! decides is checked where writes land), each supersede a record update
//! paying the DC store's latency and its faults. A failed pass is tried
//! again after `RENEW_RETRY_MS`, from where it got to
//! ([`homing_node::Resumption`]), as homingd's `reconcile_takeovers` does;
//! until one succeeds the DC grants and renews nothing. A crash loses it
//! (the lease it reconciles for dies with the process too).
//!
//! One difference from homingd: homingd runs its start-up pass before it
//! binds its server, so it serves nothing meanwhile; a simulated DC serves
//! from its restart, refusing grants, renewals and its tails (as any DC
//! owing a reconciliation does) but answering links, resolves of its
//! entries and drains during the pass (a few store round trips).

use homing_node::dc::dc_lease::RENEW_RETRY_MS;
use homing_node::{Failure, Reconcile};

use super::ctx::DcCtx;
use super::task::Task;
use super::task::TaskStepper;
use crate::counter::Counter;
use crate::event::Event;
use crate::trace::NO_KEY;

impl DcCtx<'_> {
    /// Starts the DC's reconciliation if its lease owes one and none runs.
    pub(crate) fn reconcile(&mut self) {
        let dc = &*self.inst;
        let Some(number) = dc.lease.lease.reconciliation() else {
            return;
        };
        // One pass at a time: running, or its write parked for marks.
        let pass = |task: &Task| task.kind.reconciles();
        let running =
            dc.tasks.values().any(|t| pass(t)) || dc.lease.parked.values().any(|(t, _)| pass(t));
        if !dc.up || running {
            return;
        }
        let id = self.dc.id.clone();
        // Taken, as homingd's node takes it: a failed pass leaves its own.
        let resumption = self.inst.lease.resumption.take();
        let reconcile = Reconcile::new(id, number, self.policy, self.rules.mutations)
            .resuming(resumption.as_ref());
        if reconcile.resumes_after().is_some() {
            self.measurements.count(Counter::ReconcileResumed);
        }
        let kind = TaskStepper::Reconcile(Box::new(reconcile));
        let task = Task::new(self.me(), 0, NO_KEY, kind);
        self.step_start(task);
    }

    /// A retry of the DC's failed reconciliation comes due.
    pub(crate) fn reconcile_retry(&mut self, epoch: u32) {
        if self.inst.epoch == epoch {
            self.reconcile();
        }
    }

    /// The DC's reconciliation ended: the DC grants again (and runs the
    /// next one, if it regained its lease again meanwhile), or the pass is
    /// tried again later from where it got to.
    pub(crate) fn reconciled(&mut self, reconcile: &Reconcile, done: Result<usize, Failure>) {
        match done {
            Ok(_) => {
                self.measurements.count(Counter::ReconcilePassed);
                let number = reconcile.number();
                self.inst.lease.lease.handle_reconciled(number);
                // Regained again meanwhile: the newer one is owed now
                // (homingd's loop runs it at once too).
                self.reconcile();
            }
            Err(_) => {
                self.measurements.count(Counter::ReconcileFailed);
                self.inst.lease.resumption = reconcile.resumption();
                let epoch = self.inst.epoch;
                let at = self.world.now + RENEW_RETRY_MS * 1000;
                let dc = self.addr();
                self.world.schedule(at, Event::ReconcileRetry { dc, epoch });
            }
        }
    }
}
