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
use homing_node::{NodeTime, Stored, WatchPoll, WatchRead};
use homing_store::EVENTS_LIMIT_MAX;

use crate::dc::{Next, StoreOp, Task, TaskKind};
use crate::sim::{Event, NodeId, Sim};
use crate::trace::NO_KEY;

/// How long a watcher's request waits for an event, ms.
pub const WATCH_WAIT_MS: u32 = 2_000;
/// Pause before a watcher asks again after a failure, ms.
pub const WATCH_RETRY_MS: u64 = 250;

/// A DC's `Watch` request in progress.
#[derive(Debug)]
pub(crate) struct WatchJob {
    read: WatchRead,
    /// When its wait runs out, by the DC's clock.
    deadline: NodeTime,
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
    pub(crate) fn watch_start(
        &mut self,
        d: usize,
        client: NodeId,
        rpc: u64,
        scope: NamespaceScope,
        after: EventSeq,
        wait_ms: u32,
    ) {
        let wait_ms = wait_ms.min(homing_core::wire::WAIT_MS_MAX);
        let deadline = self.node_now(d).plus_ms(u64::from(wait_ms));
        let job = WatchJob {
            read: WatchRead::new(scope, after, EVENTS_LIMIT_MAX)
                .with_mutations(self.rules.mutations),
            deadline,
            parked: None,
            generation: 0,
        };
        let task = Task::new(client, rpc, NO_KEY, TaskKind::Watch(Box::new(job)));
        let tid = self.new_task_id(d);
        self.watch_drive(d, tid, task);
    }

    /// Runs the watch until it reads, parks or answers.
    fn watch_drive(&mut self, d: usize, tid: u64, mut task: Task) {
        let now = self.node_now(d);
        let TaskKind::Watch(job) = &mut task.kind else {
            return;
        };
        let done = match job.read.poll().clone() {
            WatchPoll::Store(op) => {
                return self.dc_continue(d, tid, task, Next::Store(StoreOp::Dc(op)));
            }
            WatchPoll::Done(done) => done,
            WatchPoll::Park if now >= job.deadline => job.read.answer_now(),
            WatchPoll::Park => {
                job.generation += 1;
                job.parked = Some(job.generation);
                let event = Event::DcTask {
                    dc: d as u16,
                    epoch: self.dcs[d].epoch,
                    task: tid,
                    generation: job.generation,
                };
                let at = self.dcs[d].clock.first_true_us_at_us(job.deadline.as_us());
                self.dcs[d].watches.insert(tid);
                self.dcs[d].tasks.insert(tid, task);
                return self.schedule(at, event);
            }
        };
        let reply = match done {
            Ok((events, next)) => Reply::Events { events, next },
            Err(e) => Reply::Error(e),
        };
        self.dc_continue(d, tid, task, Next::Reply(reply));
    }

    /// A page of the event log was read for watch `tid` (a failed read
    /// answers its error in `dc_stored`).
    pub(crate) fn watch_stored(&mut self, d: usize, tid: u64, mut task: Task, page: Stored) {
        let TaskKind::Watch(job) = &mut task.kind else {
            return;
        };
        job.read.handle_stored(page);
        self.watch_drive(d, tid, task);
    }

    /// DC `d`'s event log moved: every parked watch reads again.
    pub(crate) fn watches_moved(&mut self, d: usize) {
        for tid in std::mem::take(&mut self.dcs[d].watches) {
            let Some(mut task) = self.dcs[d].tasks.remove(&tid) else {
                continue;
            };
            if let TaskKind::Watch(job) = &mut task.kind {
                job.parked = None;
                job.read.handle_moved();
            }
            self.watch_drive(d, tid, task);
        }
    }

    /// Watch `tid`'s wait ran out while parked: it answers the cursor as it stands.
    pub(crate) fn watch_deadline(&mut self, d: usize, tid: u64, mut task: Task) {
        self.dcs[d].watches.remove(&tid);
        let TaskKind::Watch(job) = &mut task.kind else {
            return;
        };
        job.parked = None;
        let reply = match job.read.answer_now() {
            Ok((events, next)) => Reply::Events { events, next },
            Err(e) => Reply::Error(e),
        };
        self.dc_continue(d, tid, task, Next::Reply(reply));
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
        let timeout_us = self.request_timeout_us + u64::from(WATCH_WAIT_MS) * 1000;
        let from = NodeId::Router(r as u32);
        let rpc = self.request_within(from, NodeId::Dc(dc), NO_KEY, request, timeout_us);
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
        let at = self.now + (pause_ms * 1000.0) as u64;
        self.schedule(at, Event::RouterWatch { router: r as u32 });
    }
}
