//! A DC's graceful shutdown (`crash_dc` with `graceful = true`), as
//! homingd's `Daemon::shutdown` runs it: the node closes — parked
//! acquirers answer now (the failure that paused them, or the last
//! `HeldElsewhere`, also those waiting at another DC), its waiters are
//! answered `TimedOut`, parked watches
//! answer the cursor as it stands —, new requests are refused
//! `Unavailable`, and requests in flight finish. The process exits once
//! none is left (checked every [`CLOSE_CHECK_MS`]): nothing it
//! acknowledged or started writing is cut. If it has not drained within
//! homingd's [`DRAIN_MS_MAX`] (or by the fault's restart time) it is cut
//! there like a crash (counted).

use super::ctx::DcCtx;
use super::task::Task;
use crate::counter::{Counter, Timing};
use homing_core::AwaitReply;
use homing_node::Answer;

use crate::event::Event;

/// How often a closing DC looks whether its requests have finished, ms.
pub const CLOSE_CHECK_MS: u64 = 10;
/// How long homingd waits for requests in flight before it exits anyway
/// (OPERATIONS.md, "Shutdown and restarts"), ms.
pub const DRAIN_MS_MAX: u64 = 5_000;

impl DcCtx<'_> {
    /// The DC starts shutting down.
    pub(crate) fn close(&mut self) {
        if !self.inst.up || self.inst.endpoint.closing() {
            return;
        }
        self.measurements.count(Counter::DcShutdownStarted);
        self.inst.closing_since = Some(self.world.now);
        self.inst.endpoint.close();
        // Waiters: answered now (homingd's `Node::close`).
        let woken = self
            .inst
            .endpoint
            .waiters_mut()
            .wake_all(AwaitReply::TimedOut);
        if !woken.is_empty() {
            self.measurements.count(Counter::WaitAnsweredAtShutdown);
        }
        self.checker.wake.on_dc_close(self.addr());
        let mut rouse = Vec::new();
        for wake in woken {
            self.inst.woken.insert(wake.waiter, wake.reply);
            rouse.push(wake.waiter);
        }
        for tid in rouse {
            self.await_rouse(tid);
        }
        // Parked watches answer the cursor as it stands.
        for tid in self.inst.watches.clone() {
            if let Some(task) = self.inst.tasks.remove(&tid) {
                self.watch_ended(tid, task, Answer::Closed);
            }
        }
        // Paused and waiting acquires answer now.
        let parked: Vec<u64> = (self.inst.tasks.iter())
            .filter(|(_, t)| {
                (t.kind.acquire()).is_some_and(|job| job.paused || job.awaiting.is_some())
            })
            .map(|(tid, _)| *tid)
            .collect();
        for tid in parked {
            let Some(task) = self.inst.tasks.remove(&tid) else {
                continue;
            };
            self.acquire_closed(tid, task);
        }
        self.close_check();
    }

    /// A paused or waiting acquire of the closing DC answers now (a
    /// registration is dropped).
    pub(crate) fn acquire_closed(&mut self, tid: u64, mut task: Box<Task>) {
        self.measurements.count(Counter::AcquireAnsweredAtShutdown);
        let Some(job) = task.kind.acquire_mut() else {
            unreachable!("a closing dc's paused task is an acquire");
        };
        // Voids its pause or deadline timer.
        job.generation += 1;
        job.paused = false;
        let awaiting = job.awaiting.take();
        self.acquire_unregister(tid, awaiting);
        self.step_answered(tid, task, homing_node::Answer::Closed);
    }

    /// The closing DC exits once no request is left (its upkeep pass and
    /// reconciliation stop with it, as homingd's background tasks do).
    pub(crate) fn close_check(&mut self) {
        let Some(since) = self.inst.closing_since else {
            return;
        };
        if !self.inst.up {
            return;
        }
        let busy = (self.inst.tasks.values()).any(|t| !t.kind.in_background());
        if busy && self.world.now - since >= DRAIN_MS_MAX * 1000 {
            // homingd exits with requests still in flight: cut like a crash.
            self.measurements.count(Counter::DcShutdownCut);
            return self.crash();
        }
        if busy {
            let at = self.world.now + CLOSE_CHECK_MS * 1000;
            return self
                .world
                .schedule(at, Event::DcCloseCheck { dc: self.addr() });
        }
        self.measurements.count(Counter::DcShutdownDrained);
        self.measurements
            .duration(Timing::DcShutdownDrain, self.world.now - since);
        self.crash();
    }
}
