//! Watches, and the router's end of them. A DC answers `Watch { scope,
//! after, wait_ms }` as homingd's `Node::watch` does, driving
//! homing-node's `WatchRead` over its store's event log (homing-store's
//! memory backend): read pages, park until the log moves (any write that
//! appends an event) or the wait runs out, answer (the DC's end:
//! `dc/watch.rs`). A crash loses parked watches (their requests time out).
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

use crate::event::{Event, Homingd, NodeId};
use crate::observe::Observer;
use crate::trace::NO_KEY;
use crate::world::World;

/// How long a watcher's request waits for an event, ms.
pub const WATCH_WAIT_MS: u32 = 2_000;
/// Pause before a watcher asks again after a failure, ms.
pub const WATCH_RETRY_MS: u64 = 250;

/// A router's watch of its region's DC.
#[derive(Debug)]
pub struct Watcher {
    /// The router watching.
    router: u32,
    /// Its region: the DC watched.
    dc: u16,
    /// The cursor: the `next` of the last answer.
    after: EventSeq,
    /// The request in flight.
    rpc: Option<u64>,
}

impl Watcher {
    /// Router `router`'s watch of its region's DC `dc`, from the start of its log.
    pub fn new(router: u32, dc: u16) -> Watcher {
        Watcher {
            router,
            dc,
            after: 0,
            rpc: None,
        }
    }

    /// Asks the DC for the events after the cursor.
    pub(crate) fn ask(&mut self, world: &mut World, observer: &mut dyn Observer) {
        let request = Request::Watch {
            scope: NamespaceScope::everything(),
            after: self.after,
            wait_ms: WATCH_WAIT_MS,
        };
        let timeout_us = world.request_timeout_us + u64::from(WATCH_WAIT_MS) * 1000;
        let from = NodeId::Router(self.router);
        let rpc = world.request_within(
            from,
            NodeId::Dc(Homingd::new(self.dc, 0)),
            NO_KEY,
            request,
            timeout_us,
        );
        self.rpc = Some(rpc);
        observer.count(Counter::WatchSent);
    }

    /// Whether `rpc` is its request in flight.
    pub(crate) fn asked(&self, rpc: u64) -> bool {
        self.rpc == Some(rpc)
    }

    /// Its request was answered (`None`: it timed out); it asks again
    /// after `pause_ms` (the workload's) or at once when told where to resume.
    pub(crate) fn answered(
        &mut self,
        reply: Option<Reply>,
        pause_ms: f64,
        world: &mut World,
        observer: &mut dyn Observer,
    ) {
        self.rpc = None;
        let asked = self.after;
        let retry_ms = WATCH_RETRY_MS as f64;
        // The next cursor (`None`: the same) and the pause before asking.
        let (cursor, pause_ms, outcome) = match reply {
            Some(Reply::Events { events, next }) => {
                let seqs: Vec<EventSeq> = events.iter().map(|e| e.seq).collect();
                let expected: Vec<EventSeq> = (asked + 1..=next).collect();
                if next < asked || seqs != expected {
                    let (r, dc) = (self.router, self.dc);
                    let detail = format!(
                        "router #{r} watching dc #{dc} from {asked} got events {seqs:?} and cursor {next}"
                    );
                    observer.on_watch_gap(detail);
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
        observer.count(outcome);
        if let Some(cursor) = cursor {
            self.after = cursor;
        }
        let at = world.now + (pause_ms * 1000.0) as u64;
        world.schedule(
            at,
            Event::RouterWatch {
                router: self.router,
            },
        );
    }
}
