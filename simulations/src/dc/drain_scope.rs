//! An operator drains a whole DC (`drain_scope` fault: `homing drain
//! --scope` over every namespace): page after page, as homingd answers
//! `DrainScope`, driving homing-node's `DrainScope` — read a page of the
//! store's records, then one `Update` with `Change::Drain` per live lease
//! on it. The pages run at the DC itself, one after another, each
//! operation taking the store's latency; a failed page is tried again
//! (draining is idempotent). `drain_scope_complete` checks the end: every
//! lease that was renewable when the drain began has changed since
//! (drained, or released, expired, linked meanwhile).

use crate::counter::Counter;
use std::collections::BTreeMap;

use homing_core::{ErrorReply, NamespaceScope, ReservationId, ScanCursor};
use homing_node::DrainScope;

use super::ctx::DcCtx;
use super::task::{Task, TaskStepper};
use crate::trace::NO_KEY;

/// One operator drain of a whole DC in progress.
#[derive(Debug)]
pub(crate) struct DrainScopeJob {
    pub(crate) page: DrainScope,
    /// Where the current page starts.
    after: Option<ScanCursor>,
    /// Failed tries of the current page.
    failures: u32,
    /// Renewable leases when the drain began, and their versions then.
    began: BTreeMap<ReservationId, u64>,
    /// Leases drained so far.
    pub(crate) drained: u64,
}

impl DcCtx<'_> {
    /// An operator starts draining every lease of the DC.
    pub(crate) fn drain_scope_begin(&mut self) {
        if !self.inst.up {
            return;
        }
        self.measurements.count(Counter::DrainScopeStarted);
        let began = (self.dc.store.records())
            .filter(|r| r.drain(None).is_some())
            .map(|r| (r.id.clone(), r.version))
            .collect();
        let job = DrainScopeJob {
            page: self.drain_scope_page_at(None),
            after: None,
            failures: 0,
            began,
            drained: 0,
        };
        self.drain_scope_page(job);
    }

    fn drain_scope_page(&mut self, job: DrainScopeJob) {
        let task = Task::new(self.me(), 0, NO_KEY, TaskStepper::DrainScope(Box::new(job)));
        self.step_start(task);
    }

    /// The DC's page of every namespace's records after `after`, as its
    /// endpoint makes a `DrainScope` request's.
    fn drain_scope_page_at(&self, after: Option<ScanCursor>) -> DrainScope {
        let scope = NamespaceScope::everything();
        self.inst.endpoint.drain_scope(scope, after)
    }

    /// A page ended: the next one, the end, or the same page again.
    pub(crate) fn drain_scope_paged(
        &mut self,
        mut job: DrainScopeJob,
        done: Result<(u32, Option<ScanCursor>), ErrorReply>,
    ) {
        match done {
            Ok((_, Some(next))) => {
                job.page = self.drain_scope_page_at(Some(next.clone()));
                (job.after, job.failures) = (Some(next), 0);
                self.drain_scope_page(job);
            }
            Ok((_, None)) => self.drain_scope_end(job),
            Err(_) => self.drain_scope_retry(job),
        }
    }

    /// The operator runs a failed page again, twenty times at most.
    fn drain_scope_retry(&mut self, mut job: DrainScopeJob) {
        self.measurements.count(Counter::DrainScopePageFailed);
        job.failures += 1;
        if job.failures > 20 {
            self.measurements.count(Counter::DrainScopeGaveUp);
            return;
        }
        job.page = self.drain_scope_page_at(job.after.clone());
        self.drain_scope_page(job);
    }

    /// The last page was drained: every lease renewable when the drain
    /// began has changed since.
    fn drain_scope_end(&mut self, job: DrainScopeJob) {
        self.measurements.count(Counter::DrainScopeDone);
        let store = &self.dc.store;
        let missed = (job.began.iter())
            .find(|(id, version)| store.record(id).is_some_and(|r| r.version == **version));
        if let Some((id, _)) = missed {
            let detail = format!(
                "dc #{}: {id}, renewable when the drain began, unchanged at its end ({} drained)",
                self.addr(),
                job.drained
            );
            self.checker.on_drain_scope_incomplete(detail);
        }
    }
}
