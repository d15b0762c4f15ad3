//! The DC's end of watches: a `Watch` request runs as a task driving
//! homing-node's `WatchRead` (its state a [`WatchJob`]), parks until the
//! DC's log moves or its wait runs out, and answers (see `crate::watch`
//! for the protocol and the router's end).

use homing_node::{Answer, NodeTime, WatchRead};

use super::ctx::DcCtx;
use super::task::{Task, TaskStepper};
use crate::event::NodeId;
use crate::trace::NO_KEY;

/// A DC's `Watch` request in progress.
#[derive(Debug)]
pub(crate) struct WatchJob {
    /// homing-node's watch.
    pub(crate) read: WatchRead,
    /// The generation of its deadline timer while parked.
    pub(crate) parked: Option<u64>,
    /// The generation of the latest deadline timer armed.
    pub(crate) generation: u64,
}

impl DcCtx<'_> {
    /// The DC starts answering a `Watch`.
    pub(crate) fn watch_start(&mut self, client: NodeId, rpc: u64, read: WatchRead) {
        let job = WatchJob {
            read,
            parked: None,
            generation: 0,
        };
        let kind = TaskStepper::Watch(Box::new(job));
        self.step_start(Task::new(client, rpc, NO_KEY, kind));
    }

    /// Watch `tid` parks until the DC's log moves or `until` (its
    /// deadline, by the DC's clock).
    pub(crate) fn watch_park(&mut self, tid: u64, mut task: Box<Task>, until: NodeTime) {
        let job = task.kind.watch_mut().expect("a watch parks");
        job.generation += 1;
        job.parked = Some(job.generation);
        let generation = job.generation;
        let at = self.dc.clock.first_true_us_at_us(until.as_us());
        self.inst.watches.insert(tid);
        self.inst.tasks.insert(tid, task);
        self.set_timer(tid, generation, at);
    }

    /// The DC's event log moved: every parked watch reads again.
    pub(crate) fn watches_moved(&mut self) {
        for tid in std::mem::take(&mut self.inst.watches) {
            let Some(mut task) = self.inst.tasks.remove(&tid) else {
                continue;
            };
            if let Some(job) = task.kind.watch_mut() {
                job.parked = None;
            }
            self.step_answered(tid, task, Answer::LogMoved(Ok(())));
        }
    }

    /// Watch `tid` stops waiting while parked: its wait ran out
    /// (`Answer::TimedOut`) or the DC shuts down (`Answer::Closed`); it
    /// answers the cursor as it stands.
    pub(crate) fn watch_ended(&mut self, tid: u64, mut task: Box<Task>, answer: Answer) {
        self.inst.watches.remove(&tid);
        if let Some(job) = task.kind.watch_mut() {
            job.parked = None;
        }
        self.step_answered(tid, task, answer);
    }
}
