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

use crate::counter::{Counter, Timing};
use homing_core::AwaitReply;
use homing_node::Answer;

use crate::event::Event;
use crate::sim::Sim;

/// How often a closing DC looks whether its requests have finished, ms.
pub const CLOSE_CHECK_MS: u64 = 10;
/// How long homingd waits for requests in flight before it exits anyway
/// (OPERATIONS.md, "Shutdown and restarts"), ms.
pub const DRAIN_MS_MAX: u64 = 5_000;

impl Sim {
    /// DC `d` starts shutting down.
    pub(crate) fn dc_close(&mut self, d: usize) {
        if !self.dcs[d].up || self.dcs[d].endpoint.closing() {
            return;
        }
        self.measurements.count(Counter::DcShutdownStarted);
        self.dcs[d].closing_since = Some(self.world.now);
        self.dcs[d].endpoint.close();
        // Waiters: answered now (homingd's `Node::close`).
        let woken = self.dcs[d].waiters.wake_all(AwaitReply::TimedOut);
        if !woken.is_empty() {
            self.measurements.count(Counter::WaitAnsweredAtShutdown);
        }
        self.checker.wake.on_dc_close(d as u16);
        let mut rouse = Vec::new();
        for wake in woken {
            self.dcs[d].woken.insert(wake.waiter, wake.reply);
            rouse.push(wake.waiter);
        }
        for tid in rouse {
            self.await_rouse(d, tid);
        }
        // Parked watches answer the cursor as it stands.
        for tid in self.dcs[d].watches.clone() {
            if let Some(task) = self.dcs[d].tasks.remove(&tid) {
                self.watch_ended(d, tid, task, Answer::Closed);
            }
        }
        // Paused and waiting acquires answer now.
        let parked: Vec<u64> = (self.dcs[d].tasks.iter())
            .filter(|(_, t)| {
                (t.kind.acquire()).is_some_and(|job| job.paused || job.awaiting.is_some())
            })
            .map(|(tid, _)| *tid)
            .collect();
        for tid in parked {
            let Some(task) = self.dcs[d].tasks.remove(&tid) else {
                continue;
            };
            self.acquire_closed(d, tid, task);
        }
        self.dc_close_check(d);
    }

    /// A paused or waiting acquire of closing DC `d` answers now (a
    /// registration is dropped).
    pub(crate) fn acquire_closed(&mut self, d: usize, tid: u64, mut task: crate::dc::Task) {
        self.measurements.count(Counter::AcquireAnsweredAtShutdown);
        let Some(job) = task.kind.acquire_mut() else {
            unreachable!("a closing dc's paused task is an acquire");
        };
        // Voids its pause or deadline timer.
        job.generation += 1;
        job.paused = false;
        let awaiting = job.awaiting.take();
        self.acquire_unregister(d, tid, awaiting);
        self.step_answered(d, tid, task, homing_node::Answer::Closed);
    }

    /// Closing DC `d` exits once no request is left (its upkeep pass and
    /// reconciliation stop with it, as homingd's background tasks do).
    pub(crate) fn dc_close_check(&mut self, d: usize) {
        let Some(since) = self.dcs[d].closing_since else {
            return;
        };
        if !self.dcs[d].up {
            return;
        }
        let busy = (self.dcs[d].tasks.values()).any(|t| !t.kind.in_background());
        if busy && self.world.now - since >= DRAIN_MS_MAX * 1000 {
            // homingd exits with requests still in flight: cut like a crash.
            self.measurements.count(Counter::DcShutdownCut);
            return self.dc_crash(d);
        }
        if busy {
            let at = self.world.now + CLOSE_CHECK_MS * 1000;
            return self
                .world
                .schedule(at, Event::DcCloseCheck { dc: d as u16 });
        }
        self.measurements.count(Counter::DcShutdownDrained);
        self.measurements
            .duration(Timing::DcShutdownDrain, self.world.now - since);
        self.dc_crash(d);
    }
}
