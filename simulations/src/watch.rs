//! Watches, both ends. A DC answers `Watch { scope, after, wait_ms }` as
//! homingd's `Node::watch` does, driving homing-node's `WatchRead` over its
//! store's event log (homing-store's memory backend): read pages, park
//! until the log moves (any write that appends an event) or the wait runs
//! out, answer. A crash loses parked watches (their requests time out).
//!
//! Each region's first router also watches its DC's whole log
//! (`workload.watch`), as an edge router following events would: it asks
//! again at once (or `workload.watch_pause_ms` later) from the cursor it
//! was given, resumes at once from where a `Trimmed` refusal says, starts
//! over from 0 when its cursor is refused as foreign (a store restarted
//! empty), and retries after a pause when a request fails or times out.
//! `watch_gap_free` checks every answer: the events after the cursor it
//! asked from, each one, in order, up to the cursor it returns (sequence
//! numbers of a DC's log have no holes), so a watcher never misses an event
//! without being told.

use crate::counter::Counter;
use homing_core::{ErrorKind, EventSeq, NamespaceScope, Reply, Request};
use homing_node::{Answer, NodeTime, WatchRead};

use crate::dc::Task;
use crate::event::{Event, NodeId};
use crate::sim::Sim;
use crate::task::TaskStepper;
use crate::trace::NO_KEY;

/// How long a watcher's request waits for an event, ms.
pub const WATCH_WAIT_MS: u32 = 2_000;
/// Pause before a watcher asks again after a failure, ms.
pub const WATCH_RETRY_MS: u64 = 250;

/// A DC's `Watch` request in progress.
#[derive(Debug)]
pub(crate) struct WatchJob {
    /// homing-node's watch.
    pub(crate) read: WatchRead,
    /// The generation of its deadline timer while parked.
    pub(crate) parked: Option<u64>,
    generation: u64,
}

/// A router's watch of its region's DC.
#[derive(Debug, Default)]
pub struct Watcher {
    /// The cursor: the `next` of the last answer.
    after: EventSeq,
    /// The request in flight.
    rpc: Option<u64>,
}

impl Sim {
    /// DC `d` starts answering a `Watch`.
    #[allow(clippy::too_many_arguments)] // the request's origin and its content
    pub(crate) fn watch_start(&mut self, d: usize, client: NodeId, rpc: u64, read: WatchRead) {
        let job = WatchJob {
            read,
            parked: None,
            generation: 0,
        };
        let kind = TaskStepper::Watch(Box::new(job));
        self.step_start(d, Task::new(client, rpc, NO_KEY, kind));
    }

    /// Watch `tid` parks until the DC's log moves or `until` (its
    /// deadline, by the DC's clock).
    pub(crate) fn watch_park(&mut self, d: usize, tid: u64, mut task: Task, until: NodeTime) {
        let job = task.kind.watch_mut().expect("a watch parks");
        job.generation += 1;
        job.parked = Some(job.generation);
        let generation = job.generation;
        let at = self.dcs[d].clock.first_true_us_at_us(until.as_us());
        self.dcs[d].watches.insert(tid);
        self.dcs[d].tasks.insert(tid, task);
        self.dc_timer(d, tid, generation, at);
    }

    /// DC `d`'s event log moved: every parked watch reads again.
    pub(crate) fn watches_moved(&mut self, d: usize) {
        for tid in std::mem::take(&mut self.dcs[d].watches) {
            let Some(mut task) = self.dcs[d].tasks.remove(&tid) else {
                continue;
            };
            if let Some(job) = task.kind.watch_mut() {
                job.parked = None;
            }
            self.step_answered(d, tid, task, Answer::LogMoved(Ok(())));
        }
    }

    /// Watch `tid` stops waiting while parked: its wait ran out
    /// (`Answer::TimedOut`) or the DC shuts down (`Answer::Closed`); it
    /// answers the cursor as it stands.
    pub(crate) fn watch_ended(&mut self, d: usize, tid: u64, mut task: Task, answer: Answer) {
        self.dcs[d].watches.remove(&tid);
        if let Some(job) = task.kind.watch_mut() {
            job.parked = None;
        }
        self.step_answered(d, tid, task, answer);
    }

    /// Router `r` asks its region's DC for the events after its cursor.
    pub(crate) fn router_watch(&mut self, r: usize) {
        let dc = self.routers[r].region;
        let Some(watcher) = &self.routers[r].watcher else {
            return;
        };
        let request = Request::Watch {
            scope: NamespaceScope::everything(),
            after: watcher.after,
            wait_ms: WATCH_WAIT_MS,
        };
        let timeout_us = self.world.request_timeout_us + u64::from(WATCH_WAIT_MS) * 1000;
        let from = NodeId::Router(r as u32);
        let rpc = self
            .world
            .request_within(from, NodeId::Dc(dc), NO_KEY, request, timeout_us);
        if let Some(watcher) = &mut self.routers[r].watcher {
            watcher.rpc = Some(rpc);
        }
        self.measurements.count(Counter::WatchSent);
    }

    /// Whether `rpc` is router `r`'s watch.
    pub(crate) fn is_router_watch(&self, r: usize, rpc: u64) -> bool {
        self.routers[r]
            .watcher
            .as_ref()
            .is_some_and(|w| w.rpc == Some(rpc))
    }

    /// Router `r`'s watch was answered (`None`: it timed out).
    pub(crate) fn router_watched(&mut self, r: usize, reply: Option<Reply>) {
        let Some(watcher) = &mut self.routers[r].watcher else {
            return;
        };
        watcher.rpc = None;
        let asked = watcher.after;
        let pause_ms = self.scenario.workload.watch_pause_ms;
        let retry_ms = WATCH_RETRY_MS as f64;
        // The next cursor (`None`: the same) and the pause before asking.
        let (cursor, pause_ms, outcome) = match reply {
            Some(Reply::Events { events, next }) => {
                let seqs: Vec<EventSeq> = events.iter().map(|e| e.seq).collect();
                let expected: Vec<EventSeq> = (asked + 1..=next).collect();
                if next < asked || seqs != expected {
                    let dc = self.routers[r].region;
                    let detail = format!(
                        "router #{r} watching dc #{dc} from {asked} got events {seqs:?} and cursor {next}"
                    );
                    self.checker.on_watch_gap(detail);
                }
                (Some(next), pause_ms, Counter::WatchAnswered)
            }
            Some(Reply::Error(e)) => match e.kind {
                // Told where to resume: at once.
                ErrorKind::Trimmed { oldest } => {
                    (Some(oldest.saturating_sub(1)), 0.0, Counter::WatchTrimmed)
                }
                ErrorKind::BadRequest => (Some(0), 0.0, Counter::WatchCursorRefused),
                _ => (None, retry_ms, Counter::WatchFailed),
            },
            Some(_) => (None, retry_ms, Counter::WatchFailed),
            None => (None, retry_ms, Counter::WatchTimedOut),
        };
        self.measurements.count(outcome);
        if let (Some(cursor), Some(watcher)) = (cursor, &mut self.routers[r].watcher) {
            watcher.after = cursor;
        }
        let at = self.world.now + (pause_ms * 1000.0) as u64;
        self.world
            .schedule(at, Event::RouterWatch { router: r as u32 });
    }
}
